"""A fake Slurm client (sbatch, squeue, sinfo, scancel) over a JSON-lines file, for tests of what
a step submits: every job starts at once and runs its whole time limit; ``FAKE_SLURM_DIR`` holds
``jobs.jsonl`` (one line per submission, in order) and ``cancelled`` (one job id a line)."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

NODES = 4


def _dir() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


def jobs() -> list[dict]:
    path = _dir() / "jobs.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def cancelled() -> set[str]:
    path = _dir() / "cancelled"
    return set(path.read_text().split()) if path.exists() else set()


def live(now: float | None = None) -> list[dict]:
    """The jobs in the queue now: neither cancelled nor past their limit."""
    now = time.time() if now is None else now
    gone = cancelled()
    return [j for j in jobs() if j["id"] not in gone and now < j["submit"] + j["limit_s"]]


def _local(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


def main(cmd: str, args: list[str]) -> int:
    if cmd == "sbatch":
        limit = int(next(a for a in args if a.startswith("--time=")).split("=", 1)[1]) * 60
        name = next(a for a in args if a.startswith("--job-name=")).split("=", 1)[1]
        jid = str(1000 + len(jobs()) + 1)
        job = {"id": jid, "name": name, "nodes": int(args[args.index("-N") + 1]), "limit_s": limit}
        with open(_dir() / "jobs.jsonl", "a") as fh:
            fh.write(json.dumps({**job, "submit": float(int(time.time()))}) + "\n")
        print(jid)
    elif cmd == "squeue":
        for j in live():
            h, m = divmod(j["limit_s"] // 60, 60)
            t = _local(j["submit"])
            print(f"{j['id']}|RUNNING|{j['nodes']}|{h:02d}:{m:02d}:00|{t}|{t}|svc|{j['name']}")
    elif cmd == "sinfo":
        used = sum(j["nodes"] for j in live())
        for i in range(1, NODES + 1):
            print(f"n{i}|{'alloc' if i <= used else 'idle'}")
    elif cmd == "scancel":
        with open(_dir() / "cancelled", "a") as fh:
            fh.write("".join(f"{a}\n" for a in args if not a.startswith("-")))
    else:
        print(f"fake slurm: no command {cmd}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
