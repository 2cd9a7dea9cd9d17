"""The evaluation protocols' decision and online command lines (``lab.evaluation.protocol_argvs``)
from a log description: protocol v1's probe replay, v2's samples with the predictor, its fresh
months, the online decider and the rules asked online after the replay that calibrates them."""

from __future__ import annotations

from lab.evaluation import protocol_argvs
from mirage_tasks.run import evalplan
from mirage_tasks.run.evalplan import LogSpec
from tests.mirage.test_evalplan import GOOD


def test_the_decision_command_lines_follow_the_wait_predictors():
    names = [n for n, _ in protocol_argvs.decision_argvs(LogSpec.from_dict(GOOD), "/r")]
    assert names[0] == "sample-train-node1" and names[-1] == "eval-node8"


def test_protocol_v2_samples_with_the_predictor_and_scores_the_fresh_months():
    s = LogSpec.from_dict(GOOD)
    v1 = dict(protocol_argvs.decision_argvs(s, "/r"))
    v2 = dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06", "2024-07")))
    tr = v2["sample-train-node1"]
    assert tr[tr.index("--waitpred") + 1] == "/r/site/waitpred" and tr[tr.index("--out") + 1].startswith("/r/site/v2-")
    # the training window is v1's (before the spec's first month), whatever the fresh months
    a, b = v1["sample-train-node1"], tr
    assert (
        a[a.index("--start") + 1] == b[b.index("--start") + 1]
        and a[a.index("--count") + 1] == b[b.index("--count") + 1]
    )
    fr = v2["sample-fresh-node1"]
    assert fr[fr.index("--start") + 1].startswith("2024-06-01") and fr[fr.index("--count") + 1] == str((30 + 31) * 4)
    ev = v2["eval-node1-fresh"]
    assert ev[ev.index("--months") + 1 : ev.index("--months") + 3] == ["2024-06", "2024-07"]
    assert "--waitpred" not in v1["sample-train-node1"] and not any(n.endswith("-fresh") for n in v1)


def test_protocol_v2_runs_the_online_decider_on_the_fresh_samples():
    s = LogSpec.from_dict(GOOD)
    v2 = dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06",)))
    fr = v2["sample-fresh-node8"]
    for rule in protocol_argvs.ONLINE_RULES:
        on = v2[f"online-node8-{rule}"]
        # the same samples as the probe replay's fresh ones
        for flag in ("--start", "--count", "--interval-hours", "--node", "--cluster-config"):
            assert on[on.index(flag) + 1] == fr[fr.index(flag) + 1], flag
        assert on[on.index("--name") + 1] == rule
    uni, tr = v2["sample-uniform-node8"], v2["sample-train-node8"]
    assert "--probe-spacing" not in uni and "--waitpred" not in uni  # the reference's spacing, no predictor
    assert uni[uni.index("--start") + 1] == tr[tr.index("--start") + 1]
    on = v2["online-node8-xgboost-uniform"]
    assert on[on.index("--model") + 1] == v2["train-uniform-node8"][v2["train-uniform-node8"].index("--out") + 1]
    # the replay's model asked within its training span (the default) and at every decision (-all)
    a, t = v2["online-node8-xgboost-all"], v2["online-node8-xgboost"]
    assert a[a.index("--model") + 1] == t[t.index("--model") + 1]
    assert a[a.index("--decide-within") + 1] == "all" and "--decide-within" not in t
    pr = v2["online-node8-xgboost-probes"]
    assert pr[pr.index("--decide-at") + 1] == "probes" and pr[pr.index("--model") + 1] == t[t.index("--model") + 1]
    assert (
        protocol_argvs.base_rule("xgboost-wp-probes") == "xgboost-wp"
        and protocol_argvs.base_rule("avg-cal") == "avg-cal"
    )
    assert "online-node8-reactive" not in dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True))  # no fresh months


def test_protocol_v2_trains_xgboost_wp_on_the_predictors_channels_and_replays_it():
    s = LogSpec.from_dict(GOOD)
    v1 = dict(protocol_argvs.decision_argvs(s, "/r"))
    v2 = dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06",)))
    mg = v2["merge-wp-node1"]
    assert "--waitpred-features" in mg and mg[mg.index("--in") + 1] == "/r/site/v2-samples-train/node1"
    tr = v2["train-node1-xgboost-wp"]
    assert tr[tr.index("--dataset") + 1] == mg[mg.index("--out") + 1] and tr[tr.index("--model") + 1] == "xgboost"
    plain = v2["train-node1-xgboost"]
    assert [a for a in tr if a not in (tr[tr.index("--dataset") + 1], tr[tr.index("--out") + 1])] == [
        a for a in plain if a not in (plain[plain.index("--dataset") + 1], plain[plain.index("--out") + 1])
    ]
    for ev in (v2["eval-node1"], v2["eval-node1-fresh"]):
        assert tr[tr.index("--out") + 1] in ev[ev.index("--models") + 1 :]
    assert not any("-wp" in n for n in v1) and "--waitpred-features" not in sum(v1.values(), [])
    # without xgboost in the budget there is nothing to extend
    no_xgb = dict(protocol_argvs.decision_argvs(s, "/r", evalplan.Budget(models=("linear_quantile",)), waitpred=True))
    assert not any("-wp" in n for n in no_xgb)


def test_protocol_v2_runs_its_rules_online_after_the_replay_that_calibrates_them():
    s = LogSpec.from_dict(GOOD)
    plan = protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06",))
    names = [n for n, _ in plan]
    v2 = dict(plan)
    fr = v2["sample-fresh-node8"]
    for rule in protocol_argvs.ONLINE_V2_RULES:
        on = v2[f"online-node8-{rule}"]
        assert names.index(f"online-node8-{rule}") > names.index("eval-node8-fresh")
        for flag in ("--start", "--count", "--interval-hours", "--node", "--cluster-config"):
            assert on[on.index(flag) + 1] == fr[fr.index(flag) + 1], (rule, flag)
        assert ("--waitpred" in on) == (rule != "avg-cal")
        if rule in ("avg-cal", "wait-pred-cal", "guarantee-cal"):
            assert (
                on[on.index("--calibration") + 1] == v2["eval-node8-fresh"][v2["eval-node8-fresh"].index("--out") + 1]
            )
        else:
            assert "--calibration" not in on
    on = v2["online-node8-xgboost-wp"]
    assert on[on.index("--model") + 1] == v2["train-node8-xgboost-wp"][v2["train-node8-xgboost-wp"].index("--out") + 1]
    al = v2["online-node8-xgboost-wp-all"]
    assert al[al.index("--model") + 1] == on[on.index("--model") + 1] and al[al.index("--decide-within") + 1] == "all"
    assert al[al.index("--waitpred") + 1] == on[on.index("--waitpred") + 1] and "--decide-within" not in on
    # every argv parses with its step's own parser
    import argparse

    from mirage_tasks.steps import validate as vstep

    p = argparse.ArgumentParser()
    vstep.add_arguments(p)
    for rule in protocol_argvs.ONLINE_V2_RULES:
        p.parse_args(v2[f"online-node8-{rule}"][1:])
    # a log the protocol does not name for them: the online decider without the v2 rules
    off = dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06",), online_rules=False))
    assert "online-node8-xgboost" in off and not any(f"online-node8-{r}" in off for r in protocol_argvs.ONLINE_V2_RULES)


def test_the_rules_asking_the_predictor_on_the_grid_can_run_on_one_node_size_alone():
    s = LogSpec.from_dict(GOOD)
    assert set(protocol_argvs.PREDICTOR_GRID_RULES) < set(protocol_argvs.ONLINE_V2_RULES)
    full = dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06",)))
    one = dict(protocol_argvs.decision_argvs(s, "/r", waitpred=True, fresh=("2024-06",), grid_rule_nodes=(8,)))
    for rule in protocol_argvs.ONLINE_V2_RULES:
        assert one[f"online-node8-{rule}"] == full[f"online-node8-{rule}"], rule
        # on node 1 the others (asked at a few fixed times) still run, with the same command lines
        assert (f"online-node1-{rule}" in one) == (rule not in protocol_argvs.PREDICTOR_GRID_RULES), rule
        if rule not in protocol_argvs.PREDICTOR_GRID_RULES:
            assert one[f"online-node1-{rule}"] == full[f"online-node1-{rule}"], rule
    # nothing else changes: the samples, models, replays and the online decider's own rules
    assert {k: v for k, v in full.items() if k not in one} == {
        f"online-node1-{r}": full[f"online-node1-{r}"] for r in protocol_argvs.PREDICTOR_GRID_RULES
    }
    assert all(one[k] == full[k] for k in one)
    # asking on the grid means asking the predictor: every one of them is given --waitpred
    assert all("--waitpred" in full[f"online-node8-{r}"] for r in protocol_argvs.PREDICTOR_GRID_RULES)
