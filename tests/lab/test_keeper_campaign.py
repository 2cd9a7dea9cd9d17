"""``lab/campaigns/keeper_campaign.py``: the windows it chooses from the log alone, the
commands it starts (each parsed by its step's own parser, so a renamed flag fails here, not an
hour into a campaign), and the page it writes from the runs' outputs."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from lab.__main__ import step_parser as lab_step_parser


def _bench():
    from lab.campaigns import keeper_campaign

    return keeper_campaign


def _page_mod():
    """lab/pages/keeper_campaign_page.py, as the campaign imports it."""
    from lab.pages import keeper_campaign_page

    return keeper_campaign_page


def _jobs(path, wait_s: np.ndarray) -> None:
    """A background's jobs (a replay's jobs.parquet or a keeper's background.parquet): one submitted
    every 10 minutes, waiting ``wait_s``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    submit = np.arange(len(wait_s)) * 600.0
    pd.DataFrame(
        {"trace_job_id": np.arange(len(wait_s)), "kind": "window", "submit_t": submit, "start_t": submit + wait_s}
    ).to_parquet(path)


def _trace(busy_from: str, busy_days: int) -> pd.DataFrame:
    """One job an hour from 2023-01-01 to 2023-03-01, starting at once, except those submitted in
    the busy span, which wait 30 h each (a queue of about 30 jobs there)."""
    sub = pd.date_range("2023-01-01", "2023-03-01", freq="1h", tz="UTC")
    b0 = pd.Timestamp(busy_from, tz="UTC")
    wait = np.where((sub >= b0) & (sub < b0 + pd.Timedelta(days=busy_days)), 30, 0)
    return pd.DataFrame({"submit": sub, "start": sub + pd.to_timedelta(wait, unit="h")})


def test_windows_are_the_busiest_above_the_training_median_and_do_not_overlap(monkeypatch):
    import mirage_tasks.data.schema as schema

    mod = _bench()
    monkeypatch.setattr(schema, "read_trace", lambda path: (_trace("2023-02-10", 6), None))
    doc = mod.choose_windows("x", "2023-01-01", "2023-02-01", "2023-02-01", "2023-03-01", 72.0, 3)
    assert doc["median_queue_train"] == 0
    starts = [pd.Timestamp(w["from"], tz="UTC") for w in doc["windows"]]
    # the busy span (Feb 10 .. Feb 16 plus its 30 h tail) holds the windows, none overlapping another
    assert len(starts) == 3 and all(
        pd.Timestamp("2023-02-08", tz="UTC") <= s <= pd.Timestamp("2023-02-17", tz="UTC") for s in starts
    )
    assert all(abs((a - b).total_seconds()) >= 72 * 3600 for a in starts for b in starts if a is not b)
    assert starts == sorted(starts) and all(w["mean_queue"] > 0 for w in doc["windows"])
    quiet = mod.choose_windows("x", "2023-02-10", "2023-02-16", "2023-01-01", "2023-02-01", 72.0, 3)
    assert quiet["windows"] == []  # nothing in January waits more than the busy span's median


def test_every_command_parses_with_its_steps_parser():
    mod = _bench()
    a = argparse.Namespace(
        policies="model,avg-cal,avg,reactive",
        model="m",
        avg_cal_samples="s",
        waitpred=None,
        factor=180.0,
        root="r",
        name="keep",
        trace="t.parquet",
        span_hours=204.0,
        chains=4,
        stagger_hours=50.0,
        deadline_s=3600.0,
        extra_nodes=0,
        offset_hours=0.0,
    )
    w = {"name": "w1", "from": "2023-02-05T00:00"}
    argv = mod.keep_argv(a, w)
    ns = lab_step_parser("keeper-slurm").parse_args(argv[4:])
    assert ns.cfg_nodes is None  # the log's cluster
    c = mod.keep_argv(argparse.Namespace(**{**vars(a), "extra_nodes": 4, "name": "keepc"}), w)
    assert lab_step_parser("keeper-slurm").parse_args(c[4:]).cfg_nodes == 82  # ls6's 78 and one per chain at a time
    assert ns.offset_hours == 0 and "--offset-hours" not in argv  # the argv (and params) of earlier runs stay
    o = mod.keep_argv(argparse.Namespace(**{**vars(a), "offset_hours": 25.0, "name": "keepc2"}), w)
    assert lab_step_parser("keeper-slurm").parse_args(o[4:]).offset_hours == 25.0
    assert "--late-nodes" not in c and "--late-nodes" not in o  # the argv of earlier sets stay
    late = lab_step_parser("keeper-slurm").parse_args(
        mod.keep_argv(
            argparse.Namespace(
                **{**vars(a), "extra_nodes": 4, "offset_hours": 12.5, "late_extra_nodes": True, "name": "keepc3"}
            ),
            w,
        )[4:]
    )
    assert (late.cfg_nodes, late.late_nodes, late.offset_hours) == (82, 4, 12.5)
    g = lab_step_parser("keeper-slurm").parse_args(
        mod.keep_argv(
            argparse.Namespace(
                **{**vars(a), "policies": "guarantee-cal,reactive", "waitpred": "wp", "guarantee_samples": "gs"}
            ),
            w,
        )[4:]
    )
    assert (g.policy, g.waitpred, g.guarantee_samples, g.model) == ("guarantee-cal,reactive", "wp", "gs", None)
    assert (ns.policy, ns.model, ns.avg_cal_samples, ns.waitpred) == ("model,avg-cal,avg,reactive", "m", "s", None)
    assert (ns.chains, ns.stagger_hours, ns.factor, ns.stop_chain) == (4, 50.0, 180.0, True)
    assert ns.background_to == "2023-02-15T12:00" and ns.out == "r/keep-w1"
    wp = mod.keep_argv(
        argparse.Namespace(**{**vars(a), "policies": "guarantee,reactive", "waitpred": "wp", "name": "keepwp"}), w
    )
    ns = lab_step_parser("keeper-slurm").parse_args(wp[4:])
    assert ns.waitpred == "wp" and ns.model is None and ns.avg_cal_samples is None and ns.out == "r/keepwp-w1"
    rp = lab_step_parser("replay-slurm").parse_args(mod.replay_argv(a, w)[4:])
    assert (rp.t_from, rp.t_to, rp.factor) == ("2023-02-05T00:00", "2023-02-13T12:00", 180.0)


def _windows(root, wins):
    """The campaign's windows.json: its busy windows ``wins`` picked from 50 candidates (40 busy)."""
    meta = {"median_queue_train": 7.0, "train": ["a", "b"], "test": ["c", "d"], "span_hours": 204.0}
    (root / "windows.json").write_text(json.dumps({**meta, "candidates": 50, "busy_candidates": 40, "windows": wins}))


def _run(root, name, w, rows):
    d = root / f"{name}-{w}"
    d.mkdir()
    pd.DataFrame(rows).to_parquet(d / "links.parquet")
    facts = {
        "loadavg_start": ["0.1", "0.1", "0.1"],
        "loadavg_end": ["0.2", "0.2", "0.2"],
        "cpu_s": 30.0,
        "wall_s": 4000.0,
        "daemons_cpu_s": 90.0,
        "errors": {},
        "avg_cal": {
            "threshold": None,
            "never_submits_early": True,
            "objective": 0.1,
            "reactive_objective": 0.1,
            "n_samples": 1260,
        },
    }
    (d / "keeper.json").write_text(json.dumps({"factor": 180, "node": 1, "facts": facts}))
    (d / "_SUCCESS.json").write_text("{}")


def test_the_page_pools_the_windows_and_says_the_verdict(tmp_path):
    page = _page_mod().page
    wins = [{"name": f"w{i}", "from": f"2023-02-0{i}T00:00", "mean_queue": 40.0} for i in (1, 2, 3)]
    _windows(tmp_path, wins)
    for w in ("w1", "w2", "w3"):
        rows = []
        for c in range(4):
            # reactive: 1 h late in every chain; model: 0.5 h early (0.5 node-h) in every chain; avg: 2 h early
            for p, s in (("model", -0.5), ("avg-cal", 1.0), ("avg", -2.0), ("reactive", 1.0)):
                rows.append(
                    {
                        "policy": p,
                        "chain": c,
                        "link": 0,
                        "pred_submit": 0.0,
                        "pred_start": 10.0,
                        "decision_lead_trace_h": max(-s, 0),
                        "signed_interruption_h": s,
                        "wasted_node_h": max(-s, 0.0),
                        "forced": p in ("reactive", "avg-cal"),
                        "model_output": np.nan,
                        "sim_signed_interruption_h": s,
                        "sim_decision_lead_h": max(-s, 0),
                    }
                )
        _run(tmp_path, "keep", w, rows)
    text = page(str(tmp_path))
    assert "| w1 | 2023-02-01T00:00 | 40.0 |" in text
    assert "| model | 3 | 12 | 12 | 12 |" in text  # 3 windows, 12 chains, 12 links, all early
    assert "**model**: submitted early in 12 of 12 links" in text and "**better than reactive**" in text
    assert "(avg's 2.00: no higher)" in text and "avg-cal decides as reactive here" in text
    assert "| model | 12 | 100% | 100% | -0.50 | -0.50 | 12 / 12 |" in text  # the simulator agrees on every link
    assert "| keep-w1 | 4000 | 30.0 | 90.0 |" in text
    assert "12 pairs of identical decisions in one cluster" in text and "differ by 0.00 h on average" in text


def test_the_background_is_read_against_two_runs_without_chains(tmp_path):
    """Two runs without chains set Slurm's own spread; the runs with chains are judged against it."""
    _background_effect = _page_mod()._background_effect
    rng = np.random.default_rng(1)
    n = 400
    wait = rng.exponential(2.0, n) * 3600

    def jobs(path, extra_h, noise):
        _jobs(path, wait + extra_h * 3600 * (wait > np.quantile(wait, 0.75)) + noise * rng.normal(0, 60, n).clip(0))

    jobs(tmp_path / "keep-w1" / "background.parquet", 2.0, 1)
    jobs(tmp_path / "keepwp-w1" / "background.parquet", 1.5, 1)
    jobs(tmp_path / "replay-w1-nochains" / "jobs.parquet", 0.0, 1)
    text = "\n".join(_background_effect(tmp_path))
    assert "| keep (4 chains at a time) | no chains | " in text and "Slurm against itself" not in text
    jobs(tmp_path / "replay-w1-nochains2" / "jobs.parquet", 0.3, 1)  # Slurm's spread: about 0.1 h
    text = "\n".join(_background_effect(tmp_path))
    assert "| no chains | no chains, again | " in text
    assert "* keep (4 chains at a time): +" in text
    assert "**the chains lengthen the background's mean wait beyond Slurm's own spread**" in text
    assert "difference sits in the long waits" in text  # only the longest quarter moved: the median stays
    # chains that bring their own capacity: the background as without them, within Slurm's spread
    jobs(tmp_path / "keepc-w1" / "background.parquet", 0.0, 1)
    text = "\n".join(_background_effect(tmp_path))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("* keepc (4 chains at a time, 78 + 4 nodes): ")]
    assert "**no distortion beyond Slurm's own spread**" in line
    # a second run without chains farther from the first than the chains are: within Slurm's spread
    jobs(tmp_path / "replay-w1-nochains2" / "jobs.parquet", -2.5, 1)
    text = "\n".join(_background_effect(tmp_path))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("* keep (4 chains at a time): ")]
    assert "**no distortion beyond Slurm's own spread**" in line and "lengthen" not in text


def test_the_distortion_verdict_has_four_outcomes():
    _distortion = _page_mod()._distortion
    assert "lengthen" in _distortion(0.2, 0.4, 0.15) and "shorten" in _distortion(-0.4, -0.2, 0.15)
    assert "no distortion" in _distortion(-0.1, 0.15, 0.15)
    assert "not separated" in _distortion(0.1, 0.3, 0.15) and "not separated" in _distortion(-0.3, 0.3, 0.15)


def test_two_sets_of_other_links_pool_without_pairing_across_sets(tmp_path):
    """keepc and keepc2 run the same policies on other links: pooled, each set's chains are paired only
    within the set (a chain index of one set is not the same decision in the other)."""
    page = _page_mod().page
    wins = [{"name": f"w{i}", "from": f"2023-02-0{i}T00:00", "mean_queue": 40.0} for i in (1, 2)]
    _windows(tmp_path, wins)
    for name, model_s in (("keepc", -0.5), ("keepc2", 2.0)):
        for w in ("w1", "w2"):
            rows = []
            for c in range(4):
                for p, s in (("model", model_s), ("reactive", 1.0)):
                    rows.append(
                        {
                            "policy": p,
                            "chain": c,
                            "link": 0,
                            "pred_submit": 0.0,
                            "pred_start": 10.0,
                            "decision_lead_trace_h": max(-s, 0),
                            "signed_interruption_h": s,
                            "wasted_node_h": max(-s, 0.0),
                            "forced": p == "reactive",
                            "model_output": np.nan,
                            "sim_signed_interruption_h": s,
                            "sim_decision_lead_h": max(-s, 0),
                        }
                    )
            # reactive's chain 0 in keepc2 interrupts 3 h: pairing it with keepc's chain 0 would change the means
            if name == "keepc2":
                rows[1]["signed_interruption_h"] = 3.0
            _run(tmp_path, name, w, rows)
    text = page(str(tmp_path))
    head = "### Sets `keepc` and `keepc2` pooled (4 runs; a chain of one set is paired only with the same set's chains)"
    assert head in text
    pooled = text.split(head)[1].split("###")[0]
    assert "| model | 4 | 16 | 16 | 16 |" in pooled  # 4 runs (2 sets x 2 windows), 16 chains, 16 links
    # model - reactive interruption on the same links: keepc 0 - 1 = -1 (8 links); keepc2 2 - 1 = +1 (6 links),
    # 2 - 3 = -1 (2 links): mean (-8 + 6 - 2) / 16 = -0.25
    (line,) = [ln for ln in pooled.splitlines() if ln.startswith("* **model**")]
    assert "interruption against reactive's on the same links -0.250 h" in line, line
    short = text.split("## In short")[1].split("## What was run")[0]  # the answer first
    assert "Sets `keepc` and `keepc2` pooled (4 runs)" in short and "-0.250 h" in short


def test_every_window_without_chains_is_read_against_slurms_spread(tmp_path):
    _background_by_window = _page_mod()._background_by_window
    rng = np.random.default_rng(2)
    n = 400

    def jobs(path, extra_h):
        _jobs(path, 7200 + extra_h * 3600 + rng.normal(0, 30, n).clip(0))

    jobs(tmp_path / "replay-w1-nochains" / "jobs.parquet", 0.0)
    jobs(tmp_path / "replay-w1-nochains2" / "jobs.parquet", 0.2)  # Slurm's spread: about 0.2 h
    jobs(tmp_path / "replay-w2-nochains" / "jobs.parquet", 0.0)
    assert _background_by_window(tmp_path, ["w1", "w2"]) == []  # no run with chains yet
    jobs(tmp_path / "keepc-w1" / "background.parquet", 0.0)
    jobs(tmp_path / "keepc-w2" / "background.parquet", 0.0)
    jobs(tmp_path / "keep-w1" / "background.parquet", 1.0)
    jobs(tmp_path / "keep-w2" / "background.parquet", 1.0)
    text = "\n".join(_background_by_window(tmp_path, ["w1", "w2", "w3"]))  # w3 not replayed without chains
    assert "(w1, w2)" in text and "| keepc | w2 | 400 |" in text and "w3" not in text
    (kc,) = [ln for ln in text.splitlines() if ln.startswith("* `keepc`, 2 windows pooled (800 jobs)")]
    assert "**no distortion beyond Slurm's own spread**" in kc and "within the spread in 2 of 2" in kc
    (k,) = [ln for ln in text.splitlines() if ln.startswith("* `keep`, 2 windows pooled")]
    assert "+1.00 h" in k and "**the chains lengthen" in k and "in 0 of 2" in k


def test_a_third_set_pools_says_its_asking_and_reads_the_predictions_computed_again(tmp_path):
    """keepc3 (the model asked at its probe times) pools with keepc and keepc2, and the page says
    the model rows pool two ways of asking; a run's repredicted.parquet replaces its stored
    simulator columns, and the page counts the predictions that moved."""
    page = _page_mod().page
    wins = [{"name": "w1", "from": "2023-02-01T00:00", "mean_queue": 40.0}]
    _windows(tmp_path, wins)
    for name in ("keepc", "keepc2", "keepc3"):
        rows = [
            {
                "policy": p,
                "chain": c,
                "link": 0,
                "pred_submit": 0.0,
                "pred_start": 10.0,
                "decision_lead_trace_h": 0.0,
                "signed_interruption_h": 1.0,
                "wasted_node_h": 0.0,
                "forced": True,
                "model_output": np.nan,
                "sim_signed_interruption_h": 1.0,
                "sim_decision_lead_h": 0.0,
            }
            for c in range(2)
            for p in ("model", "reactive")
        ]
        _run(tmp_path, name, "w1", rows)
    again = pd.read_parquet(tmp_path / "keepc3-w1" / "links.parquet")
    again.loc[again["policy"] == "model", "sim_signed_interruption_h"] = -7.0
    again.to_parquet(tmp_path / "keepc3-w1" / "repredicted.parquet")
    text = page(str(tmp_path))
    assert "### Sets `keepc` and `keepc2` and `keepc3` pooled (3 runs;" in text  # keepg has not run: three of four
    assert text.count("### Sets `keepc` and `keepc2` pooled") == 1
    short = text.split("## In short")[1].split("## What was run")[0]
    assert "pool two ways of asking the model" in short
    assert "Predicted interruptions that moved: `keepc3` model 2 of 2, reactive 0 of 2." in text
    keepc3 = text.split("### Set `keepc3`")[1].split("###")[0]
    assert "| model | 2 | 0% |" in keepc3, keepc3  # the simulator (-7 h) now disagrees with Slurm (+1 h) on both


def test_the_answer_states_the_widest_pools_verdict_lines(tmp_path):
    """The page leads with the widest pool's figures, each the one its "In short" line states; the
    per-link tables are folded."""
    page = _page_mod().page
    wins = [{"name": "w1", "from": "2023-02-01T00:00", "mean_queue": 40.0}]
    _windows(tmp_path, wins)
    for k, name in enumerate(("keepc", "keepc2", "keepc3")):
        rows = [
            {
                "policy": p,
                "chain": c,
                "link": 0,
                "pred_submit": 0.0,
                "pred_start": 10.0,
                "decision_lead_trace_h": max(-s, 0.0),
                "signed_interruption_h": s,
                "wasted_node_h": max(-s, 0.0),
                "forced": p == "reactive",
                "model_output": np.nan,
                "sim_signed_interruption_h": s,
                "sim_decision_lead_h": max(-s, 0.0),
            }
            for c in range(3)
            # the model: early by 0.2 h in one chain, interrupted 0.3 h less than reactive in another
            for p, s in (("model", (-0.2, 0.7 + 0.1 * k, 1.0)[c]), ("reactive", 1.0))
        ]
        _run(tmp_path, name, "w1", rows)
    text = page(str(tmp_path))
    lead = text.split("\n")[2]
    assert lead.startswith("**Answer.** Over the 3 runs of sets `keepc`, `keepc2`, `keepc3` pooled")
    short = text.split("## In short")[1].split("## What was run")[0]
    widest = short.split("Sets `keepc` and `keepc2` and `keepc3` pooled (3 runs)")[1]
    [line] = [ln for ln in widest.splitlines() if ln.startswith("* **model**")]
    early = line.split("submitted early in ")[1].split(" links")[0]
    diff = line.split("on the same links ")[1].split(" (")[0]
    objective = line.split("objective against reactive ")[1].split(":")[0]
    assert early.endswith(" of 9") and f"submitted early in {early} links" in lead
    assert f"interruption minus reactive's {diff} (below reactive)" in lead
    assert f"objective against reactive {objective}:" in lead
    assert "<summary>Set <code>keepc</code>: 6 rows (a rule's link each)</summary>" in text
    assert "<details>\n<summary>Every run: 3 rows</summary>\n\n| run | wall (s) |" in text
