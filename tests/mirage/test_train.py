"""The ``train`` step end to end on a small synthetic dataset in the ``merge`` format."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgboost")
pytest.importorskip("skops")

from step_cli import refused  # noqa: E402

from mirage_tasks.__main__ import STEPS  # noqa: E402
from mirage_tasks.models import datasets as D, load_model, toy as S  # noqa: E402
from stepkit import StepError  # noqa: E402
from stepkit.cli import main  # noqa: E402

TINY = {
    "transformer": ["epochs=8", "d_model=16", "d_ff=32", "lr=0.003", "patch=4"],
    "moe": [
        "n_experts=3",
        "expert_epochs=4",
        "epochs=8",
        "d_model=16",
        "d_ff=16",
        "expert_lr=0.005",
        "lr=0.005",
        "gate_hidden=8",
        "patch=4",
    ],
    "xgboost": ["n_estimators=80"],
    "random_forest": ["n_estimators=25"],
    "xgboost_quantile": ["n_estimators=80"],
    "linear_quantile": ["alpha=0.001"],
}
COMMON = ["--threads", "1", "--purge-days", "1", "--val-fraction", "0.25"]


def train(dataset, out, model, *extra, params=None):
    argv = ["train", "--model", model, "--dataset", dataset, "--out", out, *COMMON]
    for p in TINY[model] if params is None else params:
        argv += ["--param", p]
    return main("mirage_tasks", STEPS, argv + list(extra))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("data") / "ds")
    S.write_synthetic_dataset(uri, n_samples=48, window=48, seed=11)
    return uri


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    outs = {}
    for kind in TINY:
        outs[kind] = str(root / kind)
        assert train(dataset, outs[kind], kind) == 0
    return outs


def _val(dataset):
    ds = D.load_dataset(dataset)
    sp = D.chronological_split(ds, 0.25, 1.0)
    return ds, sp


@pytest.mark.parametrize("kind", list(TINY))
def test_model_beats_constant_on_held_out_data(trained, dataset, kind):
    out = trained[kind]
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    if kind.endswith("quantile"):  # a 0.9 quantile: judged by the pinball loss against the constant quantile
        ds, sp = _val(dataset)
        yv = ds.y[sp.val].astype(np.float64)
        const = np.quantile(ds.y[sp.train], 0.9)

        def pinball(pred):
            d = yv - pred
            return float(np.mean(np.maximum(0.9 * d, -0.1 * d)))

        assert pinball(load_model(out).predict(ds.X[sp.val])) < 0.8 * pinball(np.full_like(yv, const))
    else:
        assert metrics["val_mae_h"] < 0.8 * metrics["val_constant_mae_h"], metrics
    for f in ("config.json", "curves.json", "metrics.json", "_SUCCESS.json"):
        assert os.path.exists(os.path.join(out, f))
    assert not os.path.exists(os.path.join(out, "checkpoints"))
    # the reported metric is what the saved model gives
    ds, sp = _val(dataset)
    model = load_model(out)
    assert model.kind == kind
    assert metrics["val_mae_h"] == pytest.approx(D.mae(model.predict(ds.X[sp.val]), ds.y[sp.val]), rel=1e-5)


@pytest.mark.parametrize("kind", list(TINY))
def test_config_records_training_window_and_scaler(trained, kind):
    cfg = json.load(open(os.path.join(trained[kind], "config.json")))
    split = cfg["data"]["split"]
    assert split["unit"] == "sample"
    assert split["train_sample_start_max"] < split["val_sample_start_min"]
    assert cfg["data"]["train_data_end"] <= split["val_sample_start_min"]  # labels decided before validation
    assert cfg["data"]["trace_fingerprint"] == "synthetic-seed11"
    assert len(cfg["scaler"]["mean"]) == 42 and cfg["scaler"]["transform"] == "log1p-standardise"
    dec = cfg["decision"]
    assert dec["rule"] == "threshold" and dec["high_h"] == 500.0
    cal = dec["calibration"]
    assert cal["waste_weight"] == 0.1 and cal["default_threshold"] == -0.5
    assert cal["threshold"] == dec["low_h"]
    # the chosen threshold is no worse than -0.5 h or never submitting early, on the training period's split
    assert cal["chosen"]["objective"] <= min(cal["default"]["objective"], cal["reactive"]["objective"]) + 1e-9


@pytest.mark.parametrize("kind", list(TINY))
def test_decision_function_interface(trained, dataset, kind):
    ds, sp = _val(dataset)
    model = load_model(trained[kind])
    X = ds.X[sp.val][:7]
    hours = model.predict(X)
    d = model.decide(X)
    assert hours.dtype == np.float32 and hours.shape == (7,)
    assert d.submit.dtype == bool and np.array_equal(d.raw, hours)
    low, load = model.decision_rule["low_h"], model.decision_rule.get("load")
    if low is None:
        expected = np.zeros(7, bool)
    elif load is None:
        expected = (hours >= low) & (hours <= 500)
    else:  # the load-aware rule: the threshold moved by the load of each history's last snapshot
        from mirage_tasks.models.thresholds import load_values

        z = np.clip(
            (load_values(X, load["feature"], load["columns"]) - load["center"]) / load["scale"],
            load["z_min"],
            load["z_max"],
        )
        expected = (hours.astype(np.float64) - load["slope"] * z >= low) & (hours <= 500)
    assert np.array_equal(d.submit, expected)
    np.testing.assert_allclose(model.predict(X[0]), hours[:1], rtol=1e-5)  # one history [W, F] works too
    with pytest.raises(StepError, match="expects histories"):
        model.predict(X[:, :10])


@pytest.mark.parametrize("kind", list(TINY))
def test_same_seed_same_model(trained, dataset, tmp_path, kind):
    again = str(tmp_path / "again")
    assert train(dataset, again, kind) == 0
    ds, sp = _val(dataset)
    a, b = load_model(trained[kind]), load_model(again)
    assert np.array_equal(a.predict(ds.X[sp.val]), b.predict(ds.X[sp.val]))
    cfg = json.load(open(os.path.join(again, "config.json")))
    w1, w2 = os.path.join(trained[kind], cfg["weights"]), os.path.join(again, cfg["weights"])
    if kind in ("transformer", "moe"):
        a, b = torch.load(w1, weights_only=True), torch.load(w2, weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a)
    elif kind == "xgboost":
        assert open(w1, "rb").read() == open(w2, "rb").read()


def test_rerun_is_skipped(trained, dataset, capsys):
    assert train(dataset, trained["xgboost"], "xgboost") == 0
    assert "skipped" in capsys.readouterr().out


def test_killed_run_resumes_to_the_same_model(dataset, tmp_path):
    params = TINY["moe"]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    assert train(dataset, full, "moe", params=params) == 0
    # stop inside an expert phase, then inside the mixture phase, then finish
    assert train(dataset, part, "moe", "--stop-after-epochs", "2", params=params) == 75
    assert os.path.exists(os.path.join(part, "checkpoints", "train.pt"))
    assert not os.path.exists(os.path.join(part, "_SUCCESS.json"))
    assert train(dataset, part, "moe", "--stop-after-epochs", "11", params=params) == 75
    assert train(dataset, part, "moe", params=params) == 0
    a = torch.load(os.path.join(full, "model.pt"), weights_only=True)
    b = torch.load(os.path.join(part, "model.pt"), weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ca = json.load(open(os.path.join(full, "curves.json")))
    cb = json.load(open(os.path.join(part, "curves.json")))
    assert ca == cb and {c["phase"] for c in ca} == {"expert 1/3", "expert 2/3", "expert 3/3", "mixture"}


def test_corrupt_and_mismatched_files_give_clear_errors(trained, tmp_path):
    import shutil

    for kind, weights in (
        ("transformer", "model.pt"),
        ("moe", "model.pt"),
        ("xgboost", "model.ubj"),
        ("random_forest", "model.skops"),
    ):
        bad = tmp_path / f"bad_{kind}"
        shutil.copytree(trained[kind], bad)
        (bad / weights).write_bytes(b"\x00garbage" * 10)
        with pytest.raises(StepError, match=rf"bad_{kind}/{weights}"):
            load_model(str(bad))
    # weights from another architecture
    mis = tmp_path / "mis"
    shutil.copytree(trained["transformer"], mis)
    cfg = json.loads((mis / "config.json").read_text())
    cfg["arch"]["d_model"] = 32
    (mis / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StepError, match=r"mis/model.pt: weights do not match"):
        load_model(str(mis))
    # a forest file standing in for an xgboost model
    swap = tmp_path / "swap"
    shutil.copytree(trained["xgboost"], swap)
    shutil.copy(os.path.join(trained["random_forest"], "model.skops"), swap / "model.ubj")
    with pytest.raises(StepError, match=r"swap/model.ubj"):
        load_model(str(swap))
    (swap / "config.json").write_text("{not json")
    with pytest.raises(StepError, match=r"swap/config.json: not valid JSON"):
        load_model(str(swap))


def test_xgboost_quantile_option(trained, dataset, tmp_path):
    q = str(tmp_path / "q")
    assert train(dataset, q, "xgboost", "--quantile", "0.9") == 0
    cfg = json.load(open(os.path.join(q, "config.json")))
    assert cfg["xgb_params"]["objective"] == "reg:quantileerror" and cfg["xgb_params"]["quantile_alpha"] == 0.9
    ds, _ = _val(dataset)
    assert load_model(q).predict(ds.X).mean() > load_model(trained["xgboost"]).predict(ds.X).mean()


def test_linear_quantile_is_json_and_a_quantile(trained, dataset, tmp_path):
    out = trained["linear_quantile"]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["weights"] == "model.json" and cfg["quantile"] == 0.9
    doc = json.load(open(os.path.join(out, "model.json")))
    assert doc["format"] == "mirage-linear-quantile" and len(doc["coef"]) == cfg["n_tree_features"]
    ds, sp = _val(dataset)
    pred = load_model(out).predict(ds.X[sp.train])
    # a 0.9 quantile: most training targets lie below it
    assert 0.75 < float((ds.y[sp.train] <= pred).mean()) <= 1.0
    # tampered coefficients are refused with the file named
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (bad / "model.json").write_text(json.dumps({**doc, "coef": doc["coef"][:-1]}))
    with pytest.raises(StepError, match="model has .* input columns, config says"):
        load_model(str(bad))
    (bad / "model.json").write_text(json.dumps({**doc, "intercept": "x"}))
    with pytest.raises(StepError, match=r"bad/model.json: 'intercept' must be a finite number"):
        load_model(str(bad))


def test_xgboost_quantile_kind(trained, dataset):
    cfg = json.load(open(os.path.join(trained["xgboost_quantile"], "config.json")))
    assert cfg["xgb_params"]["objective"] == "reg:quantileerror" and cfg["xgb_params"]["quantile_alpha"] == 0.9
    ds, sp = _val(dataset)
    pred = load_model(trained["xgboost_quantile"]).predict(ds.X[sp.train])
    assert float((ds.y[sp.train] <= pred).mean()) > 0.75


def test_waste_weight_moves_the_threshold(dataset, tmp_path):
    low = str(tmp_path / "w0")
    high = str(tmp_path / "w100")
    assert train(dataset, low, "xgboost", "--waste-weight", "0") == 0
    assert train(dataset, high, "xgboost", "--waste-weight", "100") == 0
    a = json.load(open(os.path.join(low, "config.json")))["decision"]["calibration"]
    b = json.load(open(os.path.join(high, "config.json")))["decision"]["calibration"]
    # wasting is free: no more interruption than with an expensive waste, and no less waste
    assert a["chosen"]["mean_interruption_h"] <= b["chosen"]["mean_interruption_h"]
    assert a["chosen"]["mean_wasted_node_h"] >= b["chosen"]["mean_wasted_node_h"]
    assert train(dataset, str(tmp_path / "neg"), "xgboost", "--waste-weight", "-1") == 2


def test_sample_subset_and_fraction(dataset, tmp_path):
    ds = D.load_dataset(dataset)
    starts = np.unique(ds.sample_start)
    span = int(ds.manifest["params"]["workload_days"] * 86400) if ds.manifest.get("params") else 5 * 86400
    until = int(starts[36]) + span
    out = str(tmp_path / "sub")
    from mirage_tasks.data.times import iso

    assert train(dataset, out, "xgboost", "--samples-until", iso(until), "--sample-fraction", "0.5") == 0
    cfg = json.load(open(os.path.join(out, "config.json")))
    sub = cfg["data"]["subset"]
    assert sub["n_samples"] == 18 and sub["fraction"] == 0.5  # round(37 * 0.5)
    # the leakage guard sees the subset's end, not the dataset's
    assert D.parse_iso(cfg["data"]["data_end"]) <= until
    assert train(dataset, str(tmp_path / "z"), "xgboost", "--sample-fraction", "0") == 2


def test_bad_parameters_exit_2(dataset, tmp_path, capsys):
    out = str(tmp_path / "x")
    assert train(dataset, out, "transformer", params=["no_such=1"]) == 2
    assert "unknown parameter 'no_such'" in capsys.readouterr().err
    assert train(dataset, out, "random_forest", "--quantile", "0.5") == 2
    if not torch.cuda.is_available():
        assert train(dataset, out, "transformer", "--device", "cuda") == 2
        assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_policy_on_frozen_transformer_in_toy_env(trained, dataset, tmp_path):
    out = str(tmp_path / "pol")
    argv = [
        "train",
        "--model",
        "transformer_policy",
        "--base",
        trained["transformer"],
        "--env",
        "toy",
        "--out",
        out,
        "--threads",
        "1",
        "--param",
        "epochs=3",
        "--param",
        "episodes_per_epoch=4",
        "--param",
        "eval_episodes=4",
    ]
    assert main("mirage_tasks", STEPS, argv) == 0
    pol = load_model(out)
    ds, sp = _val(dataset)
    d = pol.decide(ds.X[sp.val][:5])
    assert d.submit.dtype == bool and ((d.raw >= 0) & (d.raw <= 1)).all()
    assert np.array_equal(d.submit, d.raw > 0.5)
    s1 = pol.decide(ds.X[sp.val][:5], rng=np.random.default_rng(3)).submit
    assert np.array_equal(s1, np.random.default_rng(3).random(5) < d.raw)  # seeded sampling
    assert np.array_equal(pol.predict(ds.X[:5]), load_model(trained["transformer"]).predict(ds.X[:5]))
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["base"]["kind"] == "transformer" and cfg["env"] == {"kind": "toy"}
    curves = json.load(open(os.path.join(out, "curves.json")))
    assert [c["epoch"] for c in curves] == [0, 1, 2, 3]
    # a policy needs a base of its own family
    wrong = [
        "train",
        "--model",
        "moe_policy",
        "--base",
        trained["transformer"],
        "--env",
        "toy",
        "--out",
        str(tmp_path / "p2"),
    ]
    assert main("mirage_tasks", STEPS, wrong) == 2


# ------------------------------------------------------------- simulator environment


@pytest.fixture(scope="module")
def ls6_small(ls6_parquet, tmp_path_factory):
    """A real sample -> merge dataset: 30 samples (every 4 h from 2022-11-01) on the ls6 preset."""
    root = tmp_path_factory.mktemp("ls6small")
    steps = {"sample": ("mirage_tasks.steps.sample", ""), "merge": ("mirage_tasks.steps.merge", "")}
    assert (
        main(
            "mirage_tasks",
            steps,
            [
                "sample",
                "--trace",
                str(ls6_parquet),
                "--start",
                "2022-11-01T00:00:00",
                "--count",
                "30",
                "--node",
                "1",
                "--cluster-config",
                "ls6",
                "--out",
                str(root / "s"),
            ],
        )
        == 0
    )
    assert main("mirage_tasks", steps, ["merge", "--in", str(root / "s"), "--out", str(root / "ds")]) == 0
    return str(root / "ds")


def test_sim_env_episodes_stay_in_their_window(ls6_parquet, ls6_small, tmp_path):
    from mirage_tasks.models.env import Env
    from mirage_tasks.models.simenv import envs_for

    base = str(tmp_path / "tx")
    assert (
        main(
            "mirage_tasks",
            STEPS,
            [
                "train",
                "--model",
                "transformer",
                "--dataset",
                ls6_small,
                "--out",
                base,
                "--threads",
                "1",
                "--purge-days",
                "1",
                "--param",
                "epochs=1",
                "--param",
                "d_model=8",
                "--param",
                "d_ff=8",
            ],
        )
        == 0
    )
    cfg = json.load(open(os.path.join(base, "config.json")))
    train_env, val_env = envs_for(str(ls6_parquet), cfg)
    assert isinstance(train_env, Env)
    split = cfg["data"]["split"]
    lo = int(np.datetime64(split["train_sample_start_min"][:19]).astype("datetime64[s]").astype(int))
    hi = int(np.datetime64(split["train_sample_start_max"][:19]).astype("datetime64[s]").astype(int))
    for seed in range(3):
        obs = train_env.reset(np.random.default_rng(seed))
        assert obs.shape == (cfg["data"]["window"], len(cfg["data"]["feature_names"]))
        obs, r, done, info = train_env.step(True)
        assert done and not info["forced"] and r == pytest.approx(-abs(info["interruption_min"]))
        assert lo <= info["sample_start"] <= hi
    train_env.reset(np.random.default_rng(5))
    n, done = 0, False
    while not done:  # always wait: the predecessor ends and submission is forced
        _, r, done, info = train_env.step(False)
        n += 1
    assert info["forced"] and n > 48 * 6  # one decision per 10 minutes through the 48 h predecessor
    # the policy step on the simulator, end to end (tiny budget)
    out = str(tmp_path / "pol")
    assert (
        main(
            "mirage_tasks",
            STEPS,
            [
                "train",
                "--model",
                "transformer_policy",
                "--base",
                base,
                "--trace",
                str(ls6_parquet),
                "--out",
                out,
                "--threads",
                "1",
                "--param",
                "epochs=1",
                "--param",
                "episodes_per_epoch=2",
                "--param",
                "eval_episodes=1",
            ],
        )
        == 0
    )
    pcfg = json.load(open(os.path.join(out, "config.json")))
    assert pcfg["env"]["train"]["decision_s"] == 600 and pcfg["env"]["train"]["node"] == 1
    assert pcfg["env"]["train"]["start_max"] < pcfg["env"]["validation"]["start_min"]
    assert load_model(out).decide(np.zeros((2, *obs.shape), np.float32)).submit.shape == (2,)


def test_hyperparameter_search_on_the_training_split(dataset, tmp_path):
    pytest.importorskip("optuna")
    out = str(tmp_path / "hpo")
    assert train(dataset, out, "xgboost", "--hpo-trials", "4", "--hpo-timeout-s", "120") == 0
    doc = json.load(open(os.path.join(out, "hpo_trials.json")))
    trials, summary = doc["trials"], doc["summary"]
    assert len(trials) == 4 and summary["n_complete"] == 4 and summary["objective"] == "val_mae_h"
    # trial 0 is the preset with the test's override; the kept one is the best on the training split
    assert trials[0]["params"]["n_estimators"] == 80 and trials[0]["params"]["max_depth"] == 4
    best = min((t for t in trials if t["state"] == "COMPLETE"), key=lambda t: t["value"])
    assert summary["best_number"] == best["number"] and summary["best_value"] <= summary["preset_value"]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert all(cfg["preset_hp"][k] == v for k, v in best["params"].items())
    assert cfg["hpo"]["data"].startswith("the training period")
    # the saved model is the best trial refitted: its validation MAE is the study's best value
    met = json.load(open(os.path.join(out, "metrics.json")))
    assert met["val_mae_h"] == pytest.approx(summary["best_value"], rel=1e-4)
    # a quantile model is searched on the pinball loss
    q = str(tmp_path / "hpo_q")
    assert train(dataset, q, "linear_quantile", "--hpo-trials", "2") == 0
    assert json.load(open(os.path.join(q, "hpo_trials.json")))["summary"]["objective"] == "val_pinball_q0.9_h"
    assert train(dataset, str(tmp_path / "bad"), "xgboost", "--hpo-trials", "-1") == 2


def test_bfloat16_autocast_trains_to_a_similar_error(trained, dataset, tmp_path):
    from mirage_tasks.models.training import amp_dtype

    out = str(tmp_path / "bf16")
    assert train(dataset, out, "transformer", params=[*TINY["transformer"], "amp=bf16"]) == 0
    fp32 = json.load(open(os.path.join(trained["transformer"], "metrics.json")))["val_mae_h"]
    bf16 = json.load(open(os.path.join(out, "metrics.json")))["val_mae_h"]
    assert bf16 < 1.25 * fp32 + 0.2, (bf16, fp32)
    assert json.load(open(os.path.join(out, "config.json")))["preset_hp"]["amp"] == "bf16"
    assert amp_dtype("auto", torch.device("cpu")) is None and amp_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert amp_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert train(dataset, str(tmp_path / "x"), "transformer", params=[*TINY["transformer"], "amp=fp8"]) == 2


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


def test_a_sample_output_where_a_dataset_is_expected_exits_2_naming_the_flag(tmp_path, capsys):
    from mirage_tasks import __version__
    from stepkit import Step

    samples = tmp_path / "samples"
    s = Step("sample", str(samples), __version__, {"fake": True})
    s.write_json("shard.json", {})
    s.commit()
    out = tmp_path / "o"
    err = refused(capsys, out, "train", "--model", "xgboost", "--dataset", samples, "--out", out, names="--dataset")
    assert "not a merge output" in err
