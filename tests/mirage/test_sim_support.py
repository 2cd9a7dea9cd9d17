"""Hand-made traces and helpers shared by the simulator, sampling and fidelity tests (no tests here)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mirage_tasks.sim import SimConfig, Simulator

T0 = 1_700_000_400  # a multiple of 600 s (and of 60 s)


def tiny_cfg(**kw) -> SimConfig:
    """4 nodes, FCFS by age, backfill every second, 1 s resolution."""
    base = dict(
        nodes=4,
        backfill="conservative",
        bf_interval_s=1,
        bf_resolution_s=1,
        bf_window_s=10**6,
        priority="age_size",
        weight_age=1000.0,
        max_age_s=10**6,
        weight_size=0.0,
        warm_start=False,
    )
    base.update(kw)
    return SimConfig(**base)


def run_jobs(cfg: SimConfig, jobs: list[tuple], t0: int = 0) -> tuple[Simulator, list[int]]:
    """jobs: (submit, nodes, duration, limit[, user]) relative to t0. Runs to completion."""
    sim = Simulator(cfg, t0)
    ids = []
    for spec in jobs:
        sub, n, dur, lim = spec[:4]
        user = spec[4] if len(spec) > 4 else -1
        j = sim.add_job(t0 + sub, dur, lim, n, user=user)
        sim.schedule_submit(j)
        ids.append(j)
    sim.drain()
    return sim, ids


def starts(sim: Simulator, ids: list[int], t0: int = 0) -> list[int]:
    return [sim.j_start[j] - t0 for j in ids]


def frame(rows: list[dict]) -> pd.DataFrame:
    """A trace frame in the normalised schema from dicts with epoch-second times."""
    out = []
    for i, r in enumerate(rows):
        out.append(
            {
                "job_id": str(r.get("job_id", i + 1)),
                "submit": pd.Timestamp(int(r["submit"]), unit="s", tz="UTC"),
                "start": pd.Timestamp(int(r["start"]), unit="s", tz="UTC"),
                "end": pd.Timestamp(int(r["end"]), unit="s", tz="UTC"),
                "time_limit_s": int(r["limit"]),
                "nodes": int(r["nodes"]),
                "procs": None,
                "partition": "gpu",
                "user": str(r.get("user", "u0")),
                "status": "COMPLETED",
                "priority": r.get("priority"),
            }
        )
    df = pd.DataFrame(out)
    for c in ("submit", "start", "end"):
        df[c] = df[c].astype("datetime64[s, UTC]")
    df["time_limit_s"] = df["time_limit_s"].astype("Int64")
    df["nodes"] = df["nodes"].astype("Int32")
    df["procs"] = df["procs"].astype("Int32")
    df["priority"] = df["priority"].astype("Int64")
    return df


def random_trace(seed: int, days: float = 10.0, nodes: int = 16, rate_per_h: float = 3.0, t0: int = T0) -> pd.DataFrame:
    """A random trace with plausible real times (starts from a crude FCFS replay); the
    default rate loads 16 nodes to about 80%."""
    rng = np.random.default_rng(seed)
    n = int(days * 24 * rate_per_h)
    submit = np.sort(t0 + rng.integers(0, int(days * 86400), n))
    limit = rng.choice([1800, 3600, 4 * 3600, 12 * 3600], n)
    dur = np.maximum(60, (limit * rng.uniform(0.05, 1.0, n)).astype(int))
    size = rng.choice([1, 1, 1, 2, 4], n)
    free_at = np.full(nodes, t0, dtype=np.int64)
    rows = []
    for i in range(n):
        k = int(size[i])
        order = np.argsort(free_at)
        st = max(int(submit[i]), int(free_at[order[k - 1]]))
        free_at[order[:k]] = st + dur[i]
        rows.append(
            {
                "submit": submit[i],
                "start": st,
                "end": st + dur[i],
                "limit": limit[i],
                "nodes": k,
                "user": f"u{rng.integers(0, 6)}",
                "priority": int(rng.integers(1000, 5000)),
            }
        )
    return frame(rows)


def write_committed_trace(folder, df: pd.DataFrame, source: str = "random") -> str:
    """Write ``df`` as ``folder/trace.parquet`` and commit it like an ingest output; returns the folder."""
    from mirage_tasks import __version__
    from mirage_tasks.data.schema import TRACE_FILE, TraceMeta, write_trace
    from stepkit import Step

    step = Step("ingest", str(folder), __version__, {"source": source, "rows": int(len(df))})
    write_trace(step.record(TRACE_FILE), df, TraceMeta(source=source, format="test", timezone="UTC"))
    step.commit()
    return str(folder)
