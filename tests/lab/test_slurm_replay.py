"""``python -m lab fidelity-slurm``: a recorded Slurm replay scored again by the simulator (other
settings, slurmctld's millisecond submissions), on a hand-made three-job replay."""

from __future__ import annotations

import pandas as pd
import pytest

from mirage_tasks.sim.config import SimConfig


def _replay_dir(tmp_path):
    import json

    rows = []
    # 3 nodes: a 2-node job runs 2 h, a second waits for it, a 1-node job fits beside (backfill)
    for k, (sub, dur, n, pr) in enumerate([(0, 7200, 2, 10.0), (60, 7200, 2, 10.0), (120, 600, 1, 1.0)]):
        rows.append(
            {
                "trace_job_id": str(k),
                "kind": "window",
                "trace_submit": sub,
                "trace_start": sub,
                "nodes": n,
                "duration_s": dur,
                "limit_s": dur,
                "priority": pr,
                "sleep_s": dur / 60,
                "limit_min": dur // 3600,
                "slurm_id": str(k),
                "submit_t": float(sub),
                "start_t": [0.0, 7200.0, 120.0][k],
            }
        )
    d = tmp_path / "replay"
    d.mkdir()
    pd.DataFrame(rows).to_parquet(d / "jobs.parquet")
    cfg = SimConfig(nodes=3).to_dict()
    (d / "replay.json").write_text(
        json.dumps({"factor": 60, "config": cfg, "from": "x", "to": "y", "run": {"horizon_t": 1e9}})
    )
    return d


def test_fidelity_slurm_rescores_a_replay(tmp_path, capsys):
    import argparse
    import json

    from lab.slurm import fidelity_slurm

    d = _replay_dir(tmp_path)
    p = argparse.ArgumentParser()
    fidelity_slurm.add_arguments(p)
    out = tmp_path / "out"
    assert fidelity_slurm.run(p.parse_args(["--replay", str(d), "--out", str(out)])) == 0
    doc = json.loads((out / "fidelity_slurm.json").read_text())
    assert doc["comparison"]["compared"] == 3 and doc["comparison"]["sim_vs_slurm"]["within_1h"] == 1.0
    # without backfill the 1-node job waits for the 2-node one: the rescoring must notice
    out2 = tmp_path / "out2"
    assert fidelity_slurm.run(p.parse_args(["--replay", str(d), "--out", str(out2), "--backfill", "none"])) == 0
    doc2 = json.loads((out2 / "fidelity_slurm.json").read_text())
    assert doc2["comparison"]["why"] and doc2["comparison"]["sim_vs_slurm"]["within_1h"] < 1.0
    from stepkit import StepError

    with pytest.raises(StepError, match="not a replay-slurm output"):
        fidelity_slurm.run(p.parse_args(["--replay", str(tmp_path / "nope"), "--out", str(tmp_path / "o3")]))


def test_fidelity_slurm_scores_named_nodes_by_default_and_takes_the_log_and_another_backfill(tmp_path):
    import argparse
    import json

    from lab.slurm import fidelity_slurm
    from stepkit import StepError

    d = _replay_dir(tmp_path)
    p = argparse.ArgumentParser()
    fidelity_slurm.add_arguments(p)
    runs = {}
    for name, extra in (("default", []), ("count", ["--sim-backfill", "conservative"])):
        out = tmp_path / name
        assert fidelity_slurm.run(p.parse_args(["--replay", str(d), "--out", str(out), *extra])) == 0
        runs[name] = json.loads((out / "fidelity_slurm.json").read_text())["comparison"]
    assert runs["default"]["sim_config"]["backfill"] == "named"  # what Slurm's sched/backfill does
    assert runs["count"]["sim_config"]["backfill"] == "conservative"
    assert runs["default"]["submit_times"] == "jobcomp (whole seconds)"
    with pytest.raises(StepError, match="--sim-backfill must be one of"):
        fidelity_slurm.run(p.parse_args(["--replay", str(d), "--out", str(tmp_path / "x"), "--sim-backfill", "nope"]))
    with pytest.raises(StepError, match="--slurm-log .*: no such file"):
        fidelity_slurm.run(
            p.parse_args(
                ["--replay", str(d), "--out", str(tmp_path / "y"), "--slurm-log", str(tmp_path / "missing.log")]
            )
        )
    # the replay as replay-slurm writes it: its start, origin and Slurm's whole-second submissions
    from datetime import datetime

    origin = datetime(2026, 12, 4, 20, 6, 3).timestamp()
    meta = json.loads((d / "replay.json").read_text())
    meta["from"], meta["run"]["origin_epoch"] = "1970-01-01T00:00:00+00:00", origin
    (d / "replay.json").write_text(json.dumps(meta))
    jobs = pd.read_parquet(d / "jobs.parquet")
    jobs["slurm_submit"] = origin + jobs["submit_t"] / 60
    jobs.to_parquet(d / "jobs.parquet")
    log = tmp_path / "slurmctld.log"  # slurmctld received each half a second into its second
    log.write_text(
        "".join(
            f"[{datetime.fromtimestamp(t + 0.5).isoformat(timespec='milliseconds')}] "
            f"_slurm_rpc_submit_batch_job: JobId={i} InitPrio=1 usec=1\n"
            for i, t in zip(jobs["slurm_id"], jobs["slurm_submit"])
        )
    )
    assert (
        fidelity_slurm.run(p.parse_args(["--replay", str(d), "--out", str(tmp_path / "ms"), "--slurm-log", str(log)]))
        == 0
    )
    ms = json.loads((tmp_path / "ms" / "fidelity_slurm.json").read_text())["comparison"]
    assert ms["submit_times"] == "slurmctld's log (ms)" and ms["compared"] == 3
    frame = pd.read_parquet(tmp_path / "ms" / "jobs.parquet")
    assert (frame["submit_t"] - jobs["submit_t"]).tolist() == pytest.approx([30.0, 30.0, 30.0])  # 0.5 s x60
    other = tmp_path / "other.log"  # a log of another cluster: none of this replay's jobs in it
    other.write_text("[2026-12-04T20:06:03.998] _slurm_rpc_submit_batch_job: JobId=999 InitPrio=1 usec=1\n")
    with pytest.raises(StepError, match="no submission of this replay's jobs"):
        fidelity_slurm.run(p.parse_args(["--replay", str(d), "--out", str(tmp_path / "z"), "--slurm-log", str(other)]))
    assert not (tmp_path / "z" / "fidelity_slurm.json").exists()  # nothing committed
