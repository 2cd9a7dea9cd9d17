"""One queue, two paths: the keeper's live path (``squeue``/``sinfo`` text,
parsed, on a cluster compressed 60x) and the simulator's own snapshots give the model the same
history, every snapshot and the predecessor's tuple included, at every decision time of the
predecessor's last hour, and so the same prediction from a model trained on simulator samples.

The simulator's state at each 10-minute tick is printed as ``squeue -o "%i|%T|%D|%l|%V|%S|%u|%j"``
and ``sinfo -N -o "%N|%t"`` would print it (real times = trace times / 60, local time, whole
seconds; limits in whole real minutes), and fed to :class:`mirage_tasks.slurm.keeper.Keeper`
through its real readers (the Slurm client call replaced by that text)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest
from test_sim_support import T0, random_trace, write_committed_trace
from test_validate_support import CLUSTER, cli, iso

from mirage_tasks.sim import features
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.engine import Simulator
from mirage_tasks.slurm import keeper as kp, queue

SCALE = 60  # trace seconds per real second
BASE = 1_800_000_000  # the compressed cluster's epoch at trace time 0
H = 3600
WINDOW = 12
SERVICE_S = 48 * H
NODES = 4


def _real(t: float) -> float:
    return BASE + t / SCALE


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(_real(t)).strftime("%Y-%m-%dT%H:%M:%S")  # Slurm prints local time


def _limit(seconds: int) -> str:
    m = seconds // SCALE // 60  # whole real minutes
    d, rem = divmod(m, 1440)
    return (f"{d}-" if d else "") + f"{rem // 60:02d}:{rem % 60:02d}:00"


def _squeue_text(sim: Simulator, pred: int) -> str:
    lines = []
    for j in range(len(sim.j_submit)):
        if sim.j_submit[j] > sim.now:
            continue
        running = j in sim.running
        pending = sim.j_start[j] < 0 or sim.j_start[j] > sim.now
        if not (running or pending):
            continue  # ended: squeue no longer lists it
        start = _stamp(sim.j_start[j]) if running else "N/A"
        name = "svc-model-0" if j == pred else "bg"
        lines.append(
            f"{j + 1}|{'RUNNING' if running else 'PENDING'}|{sim.j_nodes[j]}|{_limit(sim.j_limit[j])}|"
            f"{_stamp(sim.j_submit[j])}|{start}|root|{name}"
        )
    return "\n".join(lines) + "\n"


def _sinfo_text(sim: Simulator) -> str:
    busy = sum(sim.j_nodes[j] for j in sim.running)
    return "\n".join(f"n{i + 1}|{'alloc' if i < busy else 'idle'}" for i in range(NODES)) + "\n"


def _with_background(cfg: SimConfig, seed: int) -> tuple[Simulator, int, int]:
    """A simulator with a background in whole real seconds and minutes (submits, run times and
    limits multiples of 60 trace s, limits of whole trace hours: a real minute at x60) and the
    service's predecessor submitted 2 h in: (simulator, its submission, its job)."""
    sim = Simulator(cfg, 0)
    rng = np.random.default_rng(seed)
    for _ in range(60):
        sub = int(rng.integers(0, 60 * H // 60)) * 60
        lim = int(rng.choice([1, 2, 4, 8, 12])) * H
        dur = max(60, int(lim * rng.uniform(0.2, 1.0)) // 60 * 60)
        j = sim.add_job(sub, dur, lim, int(rng.choice([1, 1, 2, 3])))
        sim.schedule_submit(j)
    ps = 2 * H
    pred = sim.add_probe_job(ps, SERVICE_S, 1, -2)
    sim.schedule_submit(pred)
    return sim, ps, pred


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A small XGBoost trained on simulator samples (end-spaced probes), through the CLI."""
    d = tmp_path_factory.mktemp("live_model")
    write_committed_trace(d / "trace", random_trace(5, days=14, nodes=16))
    assert (
        cli(
            "sample",
            "--trace",
            d / "trace",
            "--start",
            iso(T0 + 86400),
            "--count",
            6,
            "--node",
            1,
            "--probe-spacing",
            "end",
            "--window",
            WINDOW,
            "--out",
            d / "s",
            *CLUSTER,
        )
        == 0
    )
    assert cli("merge", "--in", d / "s", "--out", d / "ds") == 0
    assert (
        cli(
            "train",
            "--model",
            "xgboost",
            "--dataset",
            d / "ds",
            "--out",
            d / "m",
            "--param",
            "n_estimators=20",
            "--val-fraction",
            "0.34",
            "--purge-days",
            "0",
            "--threads",
            "1",
        )
        == 0
    )
    return str(d / "m")


def test_the_live_path_gives_the_simulators_history_and_prediction(model, monkeypatch):
    cfg = SimConfig(nodes=NODES, backfill="conservative", bf_interval_s=60, bf_resolution_s=60)
    sim, ps, pred = _with_background(cfg, 7)
    sim.run_until(ps)
    sim.record_history(features.snapshot, ps, 600, WINDOW)

    texts = {}
    monkeypatch.setattr(queue, "run_client", lambda args, env=None, timeout=60: texts[args[0]])
    keeper = kp.Keeper(
        env={},
        policy="reactive",
        node=1,
        service_s=SERVICE_S,
        scale=SCALE,
        step_s=600,
        window=WINDOW,
        clock=lambda: _real(ps),
    )
    keeper.snaps = type(keeper.snaps)(maxlen=WINDOW)
    keeper.origin = BASE  # the model's clock: trace time 0 at the cluster's epoch
    decide, info = kp.model_decider(model)
    assert info["window"] == WINDOW
    compared = 0
    t = ps
    while True:
        sim.run_until(t)
        texts["squeue"], texts["sinfo"] = _squeue_text(sim, pred), _sinfo_text(sim)
        jobs, nodes = keeper.read()  # squeue and sinfo parsed as on a cluster
        keeper.snaps.append(keeper.snapshot(jobs, nodes, _real(t)))
        np.testing.assert_allclose(keeper.snaps[-1], sim.snaps[-1][1], rtol=1e-6, atol=1e-6)
        started = sim.j_start[pred]
        if started >= 0 and t >= started + SERVICE_S - H:  # the predecessor's last hour
            if t >= started + SERVICE_S:
                break
            p = next(q for q in jobs if q.job_id == str(pred + 1))
            live = keeper.history(p, _real(sim.j_submit[pred]), _real(t))
            want = features.history(sim, pred, 1, SERVICE_S, WINDOW)
            np.testing.assert_allclose(live, want, rtol=1e-6, atol=1e-6)
            remaining_h = (started + SERVICE_S - t) / H
            assert live[-1, features.PRED_COL + 3] == pytest.approx(SERVICE_S - remaining_h * H)
            assert decide(live) == decide(want)
            compared += 1
        t += 600
    assert compared == 6  # 60, 50, ..., 10 minutes before the end


def test_the_live_path_gives_the_wait_predictors_inputs_and_answer(monkeypatch):
    """The same queue through the keeper's readers and through the simulator gives the wait
    predictor the same inputs (every feature it was fitted on, the plans) and so the same wait and
    bound, at every decision of the predecessor's last hour; every job's estimate is its request on
    both sides (a live queue shows no user history)."""
    from test_waitpred_atprobe import _fit_doc, _log

    from mirage_tasks.calibration import atprobe, atsubmit
    from mirage_tasks.slurm import livewait

    cfg = SimConfig(
        nodes=NODES, backfill="conservative", bf_interval_s=60, bf_resolution_s=60, weight_age=5000.0, weight_size=300.0
    )
    wl = _log(n=300, seed=4)
    raw, doc, _ = _fit_doc(atsubmit.sweep(wl, cfg.replace(nodes=16), int(wl.submit[20]), int(wl.submit[-1]) + 1))
    wp = atprobe.WaitAtProbe(raw, doc, None, "UTC")
    sim, ps, pred = _with_background(cfg, 11)
    texts = {}
    monkeypatch.setattr(queue, "run_client", lambda args, env=None, timeout=60: texts[args[0]])
    keeper = kp.Keeper(
        env={},
        policy="guarantee",
        node=1,
        service_s=SERVICE_S,
        scale=SCALE,
        step_s=600,
        waitpred=wp,
        wait_cfg=cfg,
        trace_clock=(BASE, 0.0),
        clock=lambda: _real(ps),
    )
    sim.run_until(ps)
    compared, queued = 0, 0
    t = ps
    while True:
        sim.run_until(t)
        started = sim.j_start[pred]
        if started >= 0 and t >= started + SERVICE_S:
            break
        texts["squeue"], texts["sinfo"] = _squeue_text(sim, pred), _sinfo_text(sim)
        jobs, nodes = keeper.read()
        if started >= 0 and t >= started + SERVICE_S - H:
            recent = list(sim.waits)[-atsubmit.RECENT_N :]
            live = livewait.live_row(wp, cfg, jobs, nodes, _real(t), SCALE, (BASE, 0.0), recent, 1, SERVICE_S)
            want = wp.row(sim, 1, SERVICE_S)
            for c in (*atsubmit.FEATURES, "plan_request_s", "plan_s"):
                assert live[c] == pytest.approx(want[c], rel=1e-9, abs=1e-6), c
            assert wp.answer(live) == wp(sim, 1, SERVICE_S)
            queued += want["pending_jobs"] > 0
            compared += 1
        t += 600
    assert compared == 6 and queued >= 1  # 60 .. 10 minutes before the end, a queue in some


def test_the_keeper_knows_where_an_end_spaced_model_was_trained(model):
    """The keeper reads the model's training probes from its config: an end-spaced model is asked
    within the last 24 h (the default) or at its probe times (keep-service --decide-at probes)."""
    from mirage_tasks.slurm import keeper as kp

    _, info = kp.model_decider(model)
    assert info["trained_span_s"] == 86400
    assert info["trained_offsets_s"] == (86400, 57600, 28800, 14400, 7200, 3600, 1800, 600)


class _Sentinel(Exception):
    pass


@pytest.mark.parametrize("flag,asked_at", [(None, "probes"), ("probes", "probes"), ("grid", "grid")])
def test_keep_service_asks_an_end_spaced_model_at_its_probes_by_default(model, tmp_path, monkeypatch, flag, asked_at):
    """keep-service --decide-at auto (the default) hands the keeper the model's probe times, where its
    threshold was calibrated; grid asks at every reading within the last 24 h."""
    import argparse

    from mirage_tasks.slurm import session as ss
    from mirage_tasks.steps import keep_service

    seen = {}

    class FakeSession:
        def __init__(self, **kw):
            seen.update(kw)

        def run(self, deadline_s):
            raise _Sentinel

    monkeypatch.setattr(ss, "Session", FakeSession)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    p = argparse.ArgumentParser()
    keep_service.add_arguments(p)
    argv = ["--policy", "model", "--model", model, "--slurm-conf", str(conf), "--out", str(tmp_path / "o")]
    with pytest.raises(_Sentinel):
        keep_service.run(p.parse_args(argv + (["--decide-at", flag] if flag else [])))
    k = seen["keeper"]
    assert k["decide_within_s"] == 86400
    if asked_at == "probes":
        assert k["decide_at_s"] == (86400, 57600, 28800, 14400, 7200, 3600, 1800, 600)
    else:
        assert k["decide_at_s"] is None
