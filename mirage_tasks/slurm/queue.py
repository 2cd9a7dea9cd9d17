"""The live queue of a Slurm cluster, read through its ordinary clients.

:func:`squeue` / :func:`sinfo_nodes` parse ``squeue``/``sinfo`` output (fixed ``-o`` formats,
so the parse does not depend on a site's defaults); :func:`read_jobcomp` parses the
``jobcomp/filetxt`` log; :class:`LiveView` turns one queue reading into the object
:func:`mirage_tasks.sim.features.snapshot_direct` reads, so the keeper computes exactly the
features the model was trained on from the simulator.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

SQUEUE_FMT = "%i|%T|%D|%l|%V|%S|%u|%j"
#: squeue states that hold nodes; everything else pending-like counts as pending
RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"}
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}


def slurm_time(value: str) -> float | None:
    """Epoch seconds of a Slurm local ISO time; None for N/A, Unknown, None or empty."""
    v = (value or "").strip()
    if not v or v in ("N/A", "Unknown", "None", "(null)") or v.startswith("0"):
        return None
    try:
        return datetime.strptime(v, "%Y-%m-%dT%H:%M:%S").timestamp()  # Slurm prints local time
    except ValueError:
        return None


_SUBMIT_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)\] _slurm_rpc_submit_batch_job: JobId=(\d+) ")


def read_submit_log(path: str) -> dict[str, float]:
    """JobId -> epoch seconds, to the millisecond, at which slurmctld accepted each batch job (its
    log's ``_slurm_rpc_submit_batch_job`` lines, written at the default ``SlurmctldDebug=info``).
    The jobcomp log's SubmitTime has whole seconds only: at x120 that is 2 trace minutes, enough
    to put a backfill pass between jobs that Slurm received together. Empty where there is no log."""
    out: dict[str, float] = {}
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as fh:
        for ln in fh:
            m = _SUBMIT_LINE.match(ln)
            if m:
                out[m.group(2)] = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()  # local time
    return out


_RESUME_LINE = re.compile(r"^\[([0-9T:.\-]+)\] update_node: node (\S+) state set to IDLE")


def read_resume_log(path: str, nodes: list[str]) -> float | None:
    """The epoch, to the millisecond, at which slurmctld first set one of ``nodes`` back to IDLE
    (``scontrol update ... State=RESUME`` of drained nodes: its log's ``update_node`` lines); None
    where the log has none."""
    if not os.path.exists(path):
        return None
    want = set(nodes)
    with open(path, errors="replace") as fh:
        for ln in fh:
            m = _RESUME_LINE.match(ln)
            if m and m.group(2) in want:
                return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()  # local time
    return None


def limit_seconds(value: str) -> int | None:
    """Seconds of a Slurm time limit (``[D-]HH:MM:SS``, ``MM:SS``, ``UNLIMITED``)."""
    v = value.strip()
    if v in ("UNLIMITED", "INVALID", "NOT_SET", "Partition_Limit", ""):
        return None
    days = 0
    if "-" in v:
        d, v = v.split("-", 1)
        days = int(d)
    parts = [int(p) for p in v.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return days * 86400 + h * 3600 + m * 60 + s


@dataclass
class QJob:
    job_id: str
    state: str
    nodes: int
    limit_s: int | None
    submit: float | None
    start: float | None
    user: str
    name: str


class SlurmError(RuntimeError):
    pass


def run_client(args: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> str:
    r = subprocess.run(args, env=env or os.environ.copy(), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SlurmError(f"{' '.join(args[:3])}...: exit {r.returncode}: {r.stderr.strip()[:300]}")
    return r.stdout


def parse_squeue(text: str) -> list[QJob]:
    out = []
    for ln in text.splitlines():
        if not ln.strip():
            continue
        f = ln.split("|", 7)
        if len(f) != 8:
            raise SlurmError(f"squeue line with {len(f)} fields, expected 8: {ln!r}")
        out.append(
            QJob(
                job_id=f[0],
                state=f[1],
                nodes=int(f[2]),
                limit_s=limit_seconds(f[3]),
                submit=slurm_time(f[4]),
                start=slurm_time(f[5]),
                user=f[6],
                name=f[7],
            )
        )
    return out


def squeue(env: dict[str, str] | None = None, partition: str | None = None) -> list[QJob]:
    args = ["squeue", "-h", "-a", "-o", SQUEUE_FMT]
    if partition:
        args += ["-p", partition]
    return parse_squeue(run_client(args, env))


def sinfo_nodes(env: dict[str, str] | None = None, partition: str | None = None) -> dict[str, int]:
    """{"total": nodes, "idle": idle nodes, "down": unusable} of the partition."""
    args = ["sinfo", "-h", "-N", "-o", "%N|%t"]
    if partition:
        args += ["-p", partition]
    seen: dict[str, str] = {}
    for ln in run_client(args, env).splitlines():
        if "|" in ln:
            n, st = ln.split("|", 1)
            seen[n.strip()] = st.strip().rstrip("*~#!%$@^-")
    idle = sum(1 for s in seen.values() if s == "idle")
    down = sum(1 for s in seen.values() if s in ("down", "drain", "drng", "fail", "maint", "unk", "boot"))
    return {"total": len(seen), "idle": idle, "down": down}


def read_jobcomp(path: str) -> dict[str, dict[str, str]]:
    """JobId -> fields of the jobcomp/filetxt log (``Key=Value`` tokens per line)."""
    out: dict[str, dict[str, str]] = {}
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as fh:
        for ln in fh:
            rec = {}
            for tok in ln.split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    rec[k] = v
            if "JobId" in rec:
                out[rec["JobId"]] = rec
    return out


class LiveView:
    """What :func:`~mirage_tasks.sim.features.snapshot_direct` reads from a simulator, built from
    one reading of the live queue (times in the model's clock: ``scale`` trace seconds
    per real second, so a compressed cluster looks like the trace it replays)."""

    def __init__(
        self,
        jobs: list[QJob],
        nodes: dict[str, int],
        now: float | None = None,
        scale: float = 1.0,
        exclude: set[str] | None = None,
        origin: float = 0.0,
    ):
        now = time.time() if now is None else now
        self.now = (now - origin) * scale
        self.j_limit, self.j_nodes, self.j_submit, self.j_start = [], [], [], []
        self.pending: list[int] = []
        self.running: dict[int, float] = {}
        for q in jobs:
            if exclude and q.job_id in exclude:
                continue
            if q.state not in RUNNING_STATES and q.state not in PENDING_STATES:
                continue
            k = len(self.j_limit)
            lim = q.limit_s if q.limit_s is not None else 0
            self.j_limit.append(lim * scale)
            self.j_nodes.append(q.nodes)
            sub = q.submit if q.submit is not None else now
            self.j_submit.append((sub - origin) * scale)
            st = q.start if (q.start is not None and q.state in RUNNING_STATES) else -1
            self.j_start.append((st - origin) * scale if st >= 0 else -1)
            if q.state in RUNNING_STATES:
                self.running[k] = 0.0
            else:
                self.pending.append(k)
        self.free = nodes.get("idle", 0)
        self.cap = nodes.get("total", 0) - nodes.get("down", 0)


class Progress:
    """Says where a long wait stands at most once per ``every_s`` seconds (the first call says it)."""

    def __init__(self, what: str, every_s: float = 60.0):
        self.what, self.every_s, self._next = what, float(every_s), 0.0

    def maybe(self, fmt: str, *args: Any) -> None:
        """Log ``fmt % args`` when it is time to, formatted only then (as :mod:`logging` does)."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every_s
            log.info("%s: " + fmt, self.what, *args)


def cancel_ours(job_ids, env: dict[str, str], timeout: float = 15.0) -> None:
    """``scancel`` exactly these job ids (bounded; a cluster already gone is not an error)."""
    ids = sorted({str(j) for j in job_ids if j})
    if not ids:
        return
    try:
        run_client(["scancel", *ids], env, timeout=timeout)
        log.info("cancelled %d submitted job(s)", len(ids))
    except Exception as exc:  # noqa: BLE001 - the cluster may be stopping; the caller goes on stopping
        log.warning("could not cancel %d submitted job(s): %s", len(ids), exc)


def check_conf(conf: str | None, flag: str) -> str:
    """The slurm.conf a step's Slurm clients will read (``conf``, else ``$SLURM_CONF``): it must
    be a readable file, checked before anything starts (a client retries a missing one for a
    minute per call). :class:`StepError` naming ``flag`` or ``SLURM_CONF``; returns the path."""
    from stepkit import StepError

    path = conf or os.environ.get("SLURM_CONF")
    where = f"{flag} {conf}" if conf else f"SLURM_CONF={path}"
    if not path:
        raise StepError(
            f"no cluster: pass {flag} (or set SLURM_CONF)"
            if flag != "--slurm-root"
            else "no cluster: pass --slurm-root DIR (a local Slurm for this run) or set SLURM_CONF"
        )
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise StepError(f"{where}: no such readable file (the cluster's slurm.conf)")
    return path
