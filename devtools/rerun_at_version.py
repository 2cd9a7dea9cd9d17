"""Rerun a stored output at the code version its marker recorded, and compare the artefacts' digests.

    python devtools/rerun_at_version.py var/storage/mirage/traces/<key>
    python devtools/rerun_at_version.py s3://house-data/house/mirage/samples/node8-<k>/day=2023-02-11 --repo .

The output's ``_SUCCESS.json`` records the code that wrote it (``code.bundle_version``, a git commit:
:mod:`stepkit.provenance`) and the step's command line (``command``: package, argv, working folder).
This checks that commit out into a temporary git worktree of ``--repo`` (default: this repository),
runs ``python -P -m <package> <argv>`` there with ``--out`` pointing into a temporary folder and
only the worktree's code importable, and compares each artefact's SHA-256 with the one the marker
recorded: bit-identical, differs (with what is known of why: the JSON keys that differ, e.g. a
report's timing fields; threads or workers above one; a CUDA device; inputs recomputed since;
uncommitted changes in the recorded run) or missing.
The rerun's own marker must name the same commit, or the rerun did not run the recorded code and the
check fails. ``--at REV`` reruns at another commit instead (what would that code have made?).

Exit 0 when every artefact is bit-identical, 1 when any differs or the rerun failed, 2 when the
output cannot be rerun (no marker, no recorded version or command, a commit the repository lacks).
The inputs are read where the command names them (an upstream output must still be there); storage
credentials come from this process's environment, as for any step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepkit import provenance, storage
from stepkit.step import StepError, read_marker

REPO = Path(__file__).resolve().parents[1]


class CannotRerun(Exception):
    """The output cannot be rerun (exit 2)."""


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise CannotRerun(f"git {' '.join(args)} in {repo}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def out_value(argv: list[str]) -> tuple[int, str]:
    """The index and value of ``--out`` in a recorded argv."""
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            return i + 1, argv[i + 1]
        if a.startswith("--out="):
            return i, a[len("--out=") :]
    raise CannotRerun(f"the recorded command {argv} has no --out")


def with_out(argv: list[str], new_out: str) -> list[str]:
    """``argv`` with its ``--out`` replaced by ``new_out``."""
    i, _ = out_value(argv)
    argv = list(argv)
    argv[i] = f"--out={new_out}" if argv[i].startswith("--out=") else new_out
    return argv


def json_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The key paths at which two JSON documents differ (``stats.rows``, ``[3]``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            out += [sub] if (k in a) != (k in b) else json_differences(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "(whole document)"]


def _walk(doc: Any) -> list[tuple[str, Any]]:
    """Every ``(key, value)`` of a JSON document, nested ones included."""
    if isinstance(doc, dict):
        return [kv for k, v in doc.items() for kv in [(str(k), v), *_walk(v)]]
    if isinstance(doc, list):
        return [kv for v in doc for kv in _walk(v)]
    return []


def known_reasons(marker: dict[str, Any], rerun: dict[str, Any], other_code: str | None = None) -> list[str]:
    """What may make a rerun differ, as far as the markers tell (``other_code``: the commit of an
    ``--at`` rerun, when it is not the recorded one)."""
    reasons = [f"rerun at {other_code}, not at the recorded version: other code"] if other_code else []
    for key, value in _walk(marker.get("params") or {}):
        if key in ("threads", "workers", "n_jobs") and isinstance(value, int) and not isinstance(value, bool):
            if value > 1:
                reasons.append(f"computed with {key}={value}: floating-point sums may run in another order")
        elif key == "device" and isinstance(value, str) and value.startswith("cuda"):
            reasons.append(f"computed on {value}: GPU kernels are not bit-reproducible by default")
    if str((marker.get("code") or {}).get("bundle_version", "")).endswith(provenance.DIRTY):
        reasons.append("the recorded run had uncommitted changes to tracked files of its checkout")
    before = {i.get("uri"): i.get("fingerprint") for i in marker.get("inputs") or [] if isinstance(i, dict)}
    now = {i.get("uri"): i.get("fingerprint") for i in rerun.get("inputs") or [] if isinstance(i, dict)}
    changed = sorted(u for u in before if u in now and before[u] != now[u])
    if changed:
        reasons.append(f"inputs changed since the recorded run: {', '.join(map(str, changed))}")
    return reasons


def compare(marker: dict[str, Any], rerun: dict[str, Any], rerun_out: str) -> list[tuple[str, str, str]]:
    """``(artefact, verdict, detail)`` per artefact: ``identical``, ``differs``, ``missing`` or ``extra``."""
    want, got = marker.get("outputs") or {}, rerun.get("outputs") or {}
    rows = []
    for rel in sorted(set(want) | set(got)):
        if rel not in got:
            rows.append((rel, "missing", "the rerun did not write it"))
        elif rel not in want:
            rows.append((rel, "extra", "written by the rerun, not recorded"))
        elif want[rel].get("sha256") == got[rel].get("sha256"):
            rows.append((rel, "identical", str(got[rel]["sha256"])[:16]))
        else:
            detail = f"{str(want[rel].get('sha256'))[:16]} recorded, {str(got[rel]['sha256'])[:16]} now"
            if rel.endswith(".json"):
                try:
                    old = json.loads(storage.read_bytes(storage.join(marker["_uri"], rel)))
                    new = json.loads(storage.read_bytes(storage.join(rerun_out, rel)))
                    keys = json_differences(old, new)
                    detail += f"; differs at {', '.join(keys[:6])}{' ...' if len(keys) > 6 else ''}"
                except (OSError, ValueError):
                    pass
            rows.append((rel, "differs", detail))
    return rows


def rerun(uri: str, repo: Path, at: str | None = None, keep: bool = False) -> int:
    """Rerun the output at ``uri`` at its recorded version (or ``at``), print the comparison, return the exit code."""
    try:
        marker = read_marker(uri)
    except StepError as exc:
        raise CannotRerun(str(exc)) from None
    if marker is None:
        raise CannotRerun(f"{uri}: no committed output (no _SUCCESS.json)")
    code, command = marker.get("code"), marker.get("command")
    if not isinstance(command, dict) or not command.get("argv") or not command.get("package"):
        raise CannotRerun(
            f"{uri}: its marker records no command line (written before commands were recorded): run the "
            "step once more with --on-change replace to record it"
        )
    recorded = str((code or {}).get("bundle_version") or "")
    version = at or recorded
    if not version or version == provenance.UNVERSIONED:
        raise CannotRerun(f"{uri}: its marker records no code version ({provenance.describe(code)}); pass --at REV")
    sha = _git(repo, "rev-parse", "--verify", version.removesuffix(provenance.DIRTY) + "^{commit}")
    argv = [str(a) for a in command["argv"]]
    _, old_out = out_value(argv)
    marker_dir = storage.normalize(uri).rstrip("/")
    base = storage.normalize(old_out).rstrip("/")
    if marker_dir != base and not marker_dir.startswith(base + "/"):
        raise CannotRerun(f"{uri} is not under the recorded --out {old_out}")
    rel = marker_dir[len(base) + 1 :]

    print(f"{uri}: {marker.get('step')} output of {provenance.describe(code)}")
    print(f"rerunning at {sha}{' (--at ' + at + ')' if at else ''}: python -m {command['package']} {' '.join(argv)}")
    tmp = Path(tempfile.mkdtemp(prefix="rerun-at-version-"))
    src, out = tmp / "src", tmp / "out"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(src), sha)
    try:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in (provenance.BUNDLE_NAME_ENV, provenance.BUNDLE_VERSION_ENV, "PYTHONPATH")
        }
        env["PYTHONPATH"] = str(src)  # only the worktree's code (-P: not the working folder's)
        cwd = command.get("cwd") if command.get("cwd") and Path(command["cwd"]).is_dir() else str(src)
        done = subprocess.run(
            [sys.executable, "-P", "-m", command["package"], *with_out(argv, str(out))],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"the rerun failed (exit {done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}")
            return 1
        rerun_out = str(out / rel) if rel else str(out)
        new = read_marker(rerun_out)
        if new is None:
            print(f"the rerun committed no output at {rerun_out}")
            return 1
        ran = str((new.get("code") or {}).get("bundle_version") or "")
        if ran.removesuffix(provenance.DIRTY) != sha:
            print(f"the rerun ran code at {ran or 'no recorded version'}, not {sha}: it imported another checkout")
            return 1
        marker["_uri"] = marker_dir
        rows = compare(marker, new, rerun_out)
        width = max(len(r[0]) for r in rows) if rows else 0
        for name, verdict, detail in rows:
            print(f"  {name:<{width}}  {verdict:<9}  {detail}")
        same = sum(v == "identical" for _, v, _ in rows)
        print(f"{same} of {len(rows)} artefact(s) bit-identical at {sha[:12]}")
        if same != len(rows):
            other = sha if at and not recorded.startswith(sha) else None
            for reason in known_reasons(marker, new, other) or ["no known cause: the step is not deterministic here"]:
                print(f"  reason: {reason}")
            return 1
        return 0
    finally:
        if keep:
            print(f"kept {tmp} (worktree {src}: git -C {repo} worktree remove --force {src})")
        else:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(src)], capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output", help="a committed step output (the folder holding its _SUCCESS.json)")
    p.add_argument("--repo", type=Path, default=REPO, help="the git repository holding the commit (default: this one)")
    p.add_argument("--at", default=None, help="rerun at this revision instead of the recorded one")
    p.add_argument("--keep", action="store_true", help="keep the temporary worktree and output")
    args = p.parse_args(argv)
    try:
        return rerun(args.output, args.repo, args.at, args.keep)
    except CannotRerun as exc:
        print(f"rerun_at_version: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
