"""Unit tests of mirage_tasks.models: data splits, scaler, architectures, REINFORCE, loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mirage_tasks.models import datasets as D, toy as S  # noqa: E402
from stepkit import StepError  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("ds") / "ds")
    S.write_synthetic_dataset(uri, n_samples=40, window=24, seed=3)
    return uri


# ------------------------------------------------------------------------------ data


def test_dataset_roundtrip_and_order(small):
    ds = D.load_dataset(small)
    assert ds.X.dtype == np.float32 and ds.X.shape == (280, 24, 42)
    assert np.all(np.diff(ds.sample_start) >= 0)
    assert ds.manifest["n_samples"] == 40


def test_split_is_chronological_by_sample(small):
    ds = D.load_dataset(small)
    sp = D.chronological_split(ds, val_fraction=0.25, purge_days=1.0)
    tr, va = set(ds.sample[sp.train]), set(ds.sample[sp.val])
    assert not tr & va  # no sample straddles
    assert ds.sample_start[sp.train].max() + 86400 <= ds.sample_start[sp.val].min()  # purge gap held
    assert sp.info["n_val_samples"] == 10
    assert sp.info["n_purged_samples"] == 5  # samples every 4 h: 5 start less than a day before
    for s in tr | va:  # every probe of a sample on one side
        rows = np.flatnonzero(ds.sample == s)
        assert set(rows) <= set(sp.train) or set(rows) <= set(sp.val)


def test_split_refuses_too_few_samples(small):
    ds = D.load_dataset(small)
    with pytest.raises(StepError, match="purging"):
        D.chronological_split(ds, 0.2, purge_days=30)


def test_scaler_uses_training_rows_only_and_serialises(small):
    ds = D.load_dataset(small)
    sp = D.chronological_split(ds, 0.25, 1.0)
    sc = D.FeatureScaler.fit(ds.X[sp.train])
    z = sc.transform(ds.X[sp.train]).reshape(-1, 42)
    varying = z.std(0) > 0
    assert np.allclose(z.mean(0)[varying], 0, atol=1e-3) and np.allclose(z.std(0)[varying], 1, atol=1e-2)
    again = D.FeatureScaler.from_dict(json.loads(json.dumps(sc.to_dict())))
    assert np.array_equal(again.transform(ds.X[:3]), sc.transform(ds.X[:3]))
    # fitted on everything the statistics would differ: validation rows are not used
    assert not np.allclose(D.FeatureScaler.fit(ds.X).mean, sc.mean)


def test_dataset_errors_name_the_file(tmp_path, small):
    with pytest.raises(StepError, match="dataset.npz"):
        D.load_dataset(str(tmp_path))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dataset.npz").write_bytes(b"not a zip")
    (bad / "manifest.json").write_text((D.storage.read_bytes(small + "/manifest.json")).decode())
    with pytest.raises(StepError, match=r"bad/dataset.npz: not a readable"):
        D.load_dataset(str(bad))
    d = S.make_dataset(n_samples=5, window=24)
    d["manifest"]["window"] = 144
    D.write_dataset(
        str(tmp_path / "mis"), d["X"], d["y"], d["sample"], d["sample_start"], d["probe_time"], d["node"], d["manifest"]
    )
    with pytest.raises(StepError, match="window 144"):
        D.load_dataset(str(tmp_path / "mis"))


# ---------------------------------------------------------------------- architectures


def test_transformer_is_position_aware():
    from mirage_tasks.models import transformer as T

    torch.manual_seed(0)
    m = T.TransformerRegressor(
        n_features=5, window=12, d_model=8, n_heads=2, n_layers=1, d_ff=16, patch=1, dropout=0.0, head="pool"
    ).eval()
    x = torch.randn(2, 12, 5)
    flipped = x.flip(1)
    # mean pooling alone would be permutation-invariant except for the last token; compare
    # a permutation that keeps the last token in place
    perm = torch.cat([torch.randperm(11), torch.tensor([11])])
    with torch.no_grad():
        assert not torch.allclose(m(x), m(x[:, perm]), atol=1e-6)
        assert m(flipped).shape == (2,)


def test_moe_experts_start_different_and_gate_is_nonlinear():
    from mirage_tasks.models import moe

    arch = {
        "expert": {
            "n_features": 4,
            "window": 8,
            "d_model": 8,
            "n_heads": 1,
            "n_layers": 1,
            "d_ff": 8,
            "patch": 2,
            "dropout": 0.0,
            "head": "pool",
        },
        "n_experts": 3,
        "gate_hidden": 6,
        "n_features": 4,
        "window": 8,
    }
    m = moe.build(arch, seed=1)
    w = [e.embed.weight for e in m.experts]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    assert any(isinstance(layer, torch.nn.ReLU) for layer in m.gate)
    m2 = moe.build(arch, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values(), strict=True))
    preds, weights = m.parts(torch.randn(5, 8, 4))
    assert preds.shape == weights.shape == (5, 3)
    assert torch.allclose(weights.sum(-1), torch.ones(5))


def test_cuda_request_without_gpu_is_a_clear_error():
    from mirage_tasks.models import torchutil

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(StepError, match=r"torch.cuda.is_available\(\) is False"):
        torchutil.pick_device("cuda")


# --------------------------------------------------------------------------- policies


def _oracle_features(X):
    """The toy environment's interruption if submitting now (hours / 2), read off the history."""
    remaining_h = S.PRED_LIMIT_H - X[:, -1, 37] / 3600
    load = X[:, -1, 9] / 3600
    return ((S.WAIT_PER_LOAD_H * load - remaining_h) / 2)[:, None].astype(np.float32)


def _policy_hp(**kw):
    from mirage_tasks.models import presets

    return presets.resolve(
        "quick",
        "transformer_policy",
        {"epochs": 25, "episodes_per_epoch": 16, "eval_episodes": 24, "lr": 0.05, "init_submit_prob": 0.05, **kw},
    )


def test_toy_env_follows_the_protocol():
    from mirage_tasks.models.env import Env

    env = S.ToyQueueEnv(window=12)
    assert isinstance(env, Env)
    obs = env.reset(np.random.default_rng(0))
    assert obs.shape == (12, 42) and obs.dtype == np.float32 and (obs >= 0).all()
    steps, done = 0, False
    while not done:
        obs, r, done, info = env.step(False)
        steps += 1
    assert info["forced"] and r == -abs(info["interruption_min"]) and r < 0  # ended by force
    assert steps >= 3  # at least 30 minutes of remaining predecessor time, one decision per 10 min


def test_reinforce_improves_mean_return():
    from mirage_tasks.models import policy as P

    env, val_env = S.ToyQueueEnv(window=12, remaining_h=(0.5, 4.0)), S.ToyQueueEnv(window=12, remaining_h=(0.5, 4.0))
    head, curves, summary = P.train_reinforce(
        _oracle_features, 1, env, val_env, _policy_hp(), seed=0, ckpt_uri=None, fingerprint="t"
    )
    train = [c["train_return_mean"] for c in curves[1:]]
    assert np.mean(train[-5:]) > np.mean(train[:5]) + 15  # sampled policy improved (minutes)
    assert summary["best_val_return"] > summary["initial_val_return"] + 30  # greedy policy improved
    assert summary["best_epoch"] > 0
    assert summary["best_val_return"] > summary["reactive_val_return"], summary  # beats always-wait
    # the learned rule submits far more readily once the predicted interruption is positive
    with torch.no_grad():
        p = torch.softmax(head(torch.tensor([[-2.0], [1.0]])), -1)[:, 1]
    assert p[1] > 0.2 and p[1] > 3 * p[0], p


def test_reinforce_is_seeded_and_resumes(tmp_path):
    from mirage_tasks.models import StopRequested, policy as P

    def run(ckpt, stop=None):
        env, ve = S.ToyQueueEnv(window=12), S.ToyQueueEnv(window=12)
        return P.train_reinforce(
            _oracle_features, 1, env, ve, _policy_hp(epochs=6), seed=4, ckpt_uri=ckpt, fingerprint="f", stop_after=stop
        )

    h1, c1, _ = run(None)
    ck = str(tmp_path / "ck.pt")
    with pytest.raises(StopRequested):
        run(ck, stop=3)
    h2, c2, _ = run(ck)
    assert all(torch.equal(a, b) for a, b in zip(h1.state_dict().values(), h2.state_dict().values(), strict=True))
    assert [c["val_return"] for c in c1] == [c["val_return"] for c in c2]


def test_forced_steps_carry_no_gradient():
    from mirage_tasks.models import policy as P

    head = P.PolicyHead(1, 0, 0.05)
    eps = [
        {
            "features": np.ones((3, 1), np.float32),
            "actions": np.array([0, 0, 1]),
            "forced": np.array([False, False, True]),
            "return": r,
        }
        for r in (-10.0, -50.0)
    ]
    loss, stats = P.reinforce_loss(head, eps, 0.0)
    assert stats["free_steps"] == 4
    all_forced = [dict(e, forced=np.ones(3, bool)) for e in eps]
    loss2, stats2 = P.reinforce_loss(head, all_forced, 0.1)
    loss2.backward()
    assert stats2["free_steps"] == 0 and all(p.grad is None or not p.grad.any() for p in head.parameters())


def test_forest_node_arrays_are_bounds_checked():
    from types import SimpleNamespace

    from mirage_tasks.models import trees

    def forest(left, right, feat):
        tree = SimpleNamespace(
            node_count=3,
            children_left=np.array(left),
            children_right=np.array(right),
            feature=np.array(feat),
            value=np.zeros((3, 1, 1)),
        )
        return SimpleNamespace(n_features_in_=4, estimators_=[SimpleNamespace(tree_=tree)])

    trees._check_forest(forest([1, -1, -1], [2, -1, -1], [3, -2, -2]), "ok.skops")
    for bad in (
        forest([5, -1, -1], [2, -1, -1], [0, -2, -2]),  # child outside the arrays
        forest([0, -1, -1], [2, -1, -1], [0, -2, -2]),  # a cycle back to the root
        forest([1, -1, -1], [2, -1, -1], [9, -2, -2]),
    ):  # feature index out of range
        with pytest.raises(StepError, match="bad.skops: tree 0"):
            trees._check_forest(bad, "bad.skops")


# ---------------------------------------------------------------- decision calibration


def test_calibration_replays_first_probe_at_or_above_the_threshold():
    from mirage_tasks.models import thresholds as C

    # two samples of three probes (the last = the predecessor's end)
    sample = np.array([0, 0, 0, 1, 1, 1])
    y = np.array([-10.0, -2.0, 3.0, -5.0, 1.0, 4.0])
    score = np.array([-9.0, -1.0, 2.0, 0.5, 0.7, 3.0])
    np.testing.assert_array_equal(C.outcomes(score, y, sample, 0.0), [3.0, -5.0])
    np.testing.assert_array_equal(C.outcomes(score, y, sample, -1.5), [-2.0, -5.0])
    np.testing.assert_array_equal(C.outcomes(score, y, sample, np.inf), [3.0, 4.0])  # reactive
    o = C.objective(np.array([3.0, -5.0]), node=2, waste_weight=0.1)
    assert o == {"mean_interruption_h": 1.5, "mean_wasted_node_h": 5.0, "zero_share": 0.5, "objective": 2.0}


def test_calibration_picks_the_cheapest_threshold_and_prices_waste():
    from mirage_tasks.models import thresholds as C

    rng = np.random.default_rng(0)
    n_s, probes = 200, 7
    sample = np.repeat(np.arange(n_s), probes)
    # the true signed interruption rises over the predecessor's run; the score is it plus noise
    base = rng.normal(-20, 6, n_s)[:, None] + np.linspace(0, 28, probes)[None, :]
    y = base.ravel()
    score = y + rng.normal(0, 1, y.shape)
    free = C.calibrate(score, y, sample, node=1, waste_weight=0.0, default=-0.5)
    dear = C.calibrate(score, y, sample, node=1, waste_weight=10.0, default=-0.5)
    assert free["chosen"]["objective"] <= free["default"]["objective"] + 1e-12
    assert free["chosen"]["mean_interruption_h"] <= dear["chosen"]["mean_interruption_h"]
    assert dear["chosen"]["mean_wasted_node_h"] <= free["chosen"]["mean_wasted_node_h"]
    # no threshold does better than the grid's best (checked against a fine brute force)
    brute = min(
        C.objective(C.outcomes(score, y, sample, t), 1, 10.0)["objective"] for t in np.r_[np.sort(score), np.inf]
    )
    assert dear["chosen"]["objective"] <= brute + 0.05
    # a score that never reaches any useful level: never submitting early is chosen and said
    never = C.calibrate(
        np.full_like(y, -100.0),
        np.where(np.arange(len(y)) % probes == probes - 1, 0.0, -30.0),
        sample,
        node=8,
        waste_weight=0.1,
    )
    assert never["threshold"] is None and never["never_submits_early"]


def test_forest_arrays_predict_like_scikit_learn():
    from sklearn.ensemble import RandomForestRegressor

    from mirage_tasks.models.trees import ForestArrays

    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 12)).astype(np.float32)
    y = X[:, 0] * 3 + np.sin(X[:, 1]) + rng.normal(0, 0.1, 400)
    rf = RandomForestRegressor(n_estimators=20, min_samples_leaf=2, max_features=0.5, random_state=0).fit(X, y)
    fa = ForestArrays(rf)
    Xt = rng.normal(size=(300, 12)).astype(np.float32)
    np.testing.assert_allclose(fa.predict(Xt), rf.predict(Xt), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fa.predict(Xt[:1]), rf.predict(Xt[:1]), rtol=1e-5, atol=1e-5)


def test_ppo_updates_make_the_greedy_policy_submit():
    """Before/after on the same toy episodes: one REINFORCE step per batch leaves a low per-step
    hazard whose argmax never submits (the reactive baseline); clipped PPO updates fix it."""
    from mirage_tasks.models import policy as P, presets

    def fit(**kw):
        hp = presets.resolve("quick", "transformer_policy", {"parallel_envs": 8, **kw})
        envs = [S.ToyQueueEnv(window=12) for _ in range(8)]
        val = [S.ToyQueueEnv(window=12) for _ in range(8)]
        _, curves, summary = P.train_reinforce(
            _oracle_features, 1, envs, val, hp, seed=0, ckpt_uri=None, fingerprint="t"
        )
        return curves, summary

    c_before, before = fit(ppo_epochs=1, entropy_final=0.1)
    c_after, after = fit()  # the preset: ppo_epochs=8, entropy decaying to 0
    assert before["method"] == "REINFORCE" and after["method"].startswith("PPO")
    assert before["greedy_never_submits"] and before["greedy_val_forced_share"] == 1.0
    assert not after["greedy_never_submits"] and after["greedy_val_forced_share"] < 0.25
    assert after["greedy_val_return"] > before["greedy_val_return"] + 30
    assert after["greedy_val_return"] > after["reactive_val_return"] + 30
    assert c_after[-1]["entropy_coef"] == 0.0 and c_after[1]["entropy_coef"] == 0.1


def test_calibration_ties_break_toward_never_early():
    from mirage_tasks.models import thresholds as C

    sample = np.repeat(np.arange(3), 3)
    y = np.array([-16.0, -8.0, 0.0] * 3)  # every early probe overlaps, the last is exact
    score = np.array([-9.0, -7.0, -0.2] * 3)
    cal = C.calibrate(score, y, sample, node=1, waste_weight=0.1, default=-0.5)
    # -0.5 submits at the last probe, like never submitting early: a tie, so never early stays
    assert not cal["kept_default"] and cal["threshold"] is None and cal["never_submits_early"]
    # free waste: every threshold ties with reactive on the objective; the latest (never) is kept
    free = C.calibrate(score, y, sample, node=1, waste_weight=0.0, default=-10.0)
    assert free["never_submits_early"] and not free["kept_default"]
    cal2 = C.calibrate(score, np.array([-16.0, -8.0, 3.0] * 3), sample, node=1, waste_weight=0.01, default=-0.5)
    assert not cal2["kept_default"] and cal2["threshold"] < -0.5  # here submitting earlier pays
