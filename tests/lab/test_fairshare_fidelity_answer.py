"""fairshare-fidelity.md leads with its answer; its figures are the page's own table cells."""

from __future__ import annotations

from lab.campaigns.fairshare_fidelity import page


def _pair(a: str, b: str, d: float, lo: float, hi: float) -> dict:
    return {
        "a": a,
        "b": b,
        "mae_h_diff": d,
        "mae_h_diff_ci": (lo, hi),
        "within_1h_diff": d / 10,
        "within_1h_diff_ci": (lo / 10, hi / 10),
    }


def _summary() -> dict:
    cfg = {"recorded": 2.5, "age_size": 3.5, "fairshare-3000": 2.6, "fairshare-30000": 2.9}
    return {
        "window": ["2022-12-01T00:00", "2023-04-01T00:00"],
        "jobs": 1000,
        "episodes": 25,
        "episode_days": 5,
        "resamples": 2000,
        "zero_wait_mae_h": 3.7,
        "configs": {n: {"mae_h": v, "within_1h": 0.6, "replay_wall_s": 2.0} for n, v in cfg.items()},
        "pairs": [
            _pair("fairshare-3000", "age_size", -0.9, -1.2, -0.6),
            _pair("fairshare-3000", "recorded", 0.1, -0.05, 0.2),
            _pair("fairshare-30000", "recorded", 0.4, 0.2, 0.6),
        ],
        "at_submission": {
            "jobs": 1000,
            "days": 121,
            "zero_mae_h": 3.7,
            "zero_within_1h": 0.7,
            "plans": {
                "age_size:plan_s": {"mae_h": 4.3, "within_1h": 0.5},
                "fairshare-3000:plan_s": {"mae_h": 3.3, "within_1h": 0.66},
            },
            "pairs": [
                _pair("age_size:plan_s", "zero", 0.6, 0.3, 0.9),
                _pair("fairshare-3000:plan_s", "zero", -0.4, -0.6, -0.1),
            ],
        },
    }


def test_the_answer_states_the_tables_figures():
    text = page(_summary())
    lines = text.splitlines()
    lead = lines[2]
    assert lead.startswith("**Answer.**") and lines[0].startswith("# ")

    def cells(first: str) -> list[str]:
        [row] = [ln for ln in lines if ln.startswith(f"| {first} |")]
        return [c.strip() for c in row.strip("|").split("|")]

    assert f"recorded {cells('recorded')[1]} h, age_size {cells('age_size')[1]} h" in lead
    assert "not told apart for fairshare-3000; worse for fairshare-30000" in lead
    assert f"(fairshare-3000 {cells('fairshare-3000 - recorded')[1]} h)" in lead
    assert f"fairshare-3000 against age only {cells('fairshare-3000 - age_size')[1]} h" in lead
    best = cells("fairshare-3000:plan_s - zero")
    assert f"fairshare-3000:plan_s ({cells('fairshare-3000:plan_s')[1]} h)" in lead
    assert f"{best[1]} h, within 1 h {best[2]}." in lead
