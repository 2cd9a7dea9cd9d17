"""``report``: one self-contained HTML page (and Markdown) with every section."""

from __future__ import annotations

import base64
import html.parser
import json
from datetime import UTC
from pathlib import Path

from test_validate_support import NODE, cli, fidelity_out, policy_world, world  # noqa: F401 - fixtures

from mirage_tasks.evaluation import report as R
from stepkit import provenance

PNG = b"\x89PNG\r\n\x1a\n"


class Parsed(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.h2: list[str] = []
        self.images: list[dict] = []
        self.links: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id"))
        elif tag == "h2":
            self._in_h2 = True
            self.h2.append("")
        elif tag == "img":
            self.images.append(a)
        elif tag in ("link", "script"):
            self.links.append(a.get("href") or a.get("src") or tag)

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_h2:
            self.h2[-1] += data


def parse(path) -> tuple[Parsed, str]:
    text = open(path, encoding="utf-8").read()
    p = Parsed()
    p.feed(text)
    return p, text


def test_full_report_has_every_section_and_embedded_plots(policy_world, fidelity_out, tmp_path):
    w = policy_world
    met = tmp_path / "met"
    assert cli("metrics", "--in", w["v_reactive"], w["v_avg"], w["v_xgb"], "--out", met, "--bootstrap", "100") == 0
    out = tmp_path / "rep"
    assert (
        cli(
            "report",
            "--in",
            met,
            fidelity_out,
            w["xgb"],
            w["tx"],
            w["pol"],
            w["dataset"],
            w["v_xgb"],
            "--out",
            out,
            "--title",
            "Tiny world",
        )
        == 0
    )
    p, text = parse(out / "report.html")
    assert "<title>Tiny world</title>" in text and "<h1>Tiny world</h1>" in text
    assert p.sections == [sid for sid, _ in R.SECTIONS]
    assert [h.strip() for h in p.h2] == [t for _, t in R.SECTIONS]
    assert not p.links  # self-contained: no stylesheets or scripts to fetch
    # CDF + box for the node size, one training figure per train output
    assert len(p.images) == 2 + 3
    for img in p.images:
        src = img["src"]
        assert src.startswith("data:image/png;base64,") and img.get("alt")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG
    assert "Not available" not in text
    for needle in (
        "reactive",
        "avg",
        "xgboost",
        f"{NODE}-node jobs",
        "mean interruption h",
        "pooled",
        "Held-out scores",
        "transformer_policy",
        "merge",
    ):
        assert needle in text, needle
    md = (out / "report.md").read_text()
    assert md.startswith("# Tiny world\n")
    for _, title in R.SECTIONS:
        assert f"## {title}" in md
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert figs == [f"box_node{NODE}.png", f"cdf_node{NODE}.png", "training_0.png", "training_1.png", "training_2.png"]
    assert all(f"figures/{f}" in md for f in figs)
    marker = json.load(open(out / "_SUCCESS.json"))
    assert marker["step"] == "report" and set(marker["summary"]["headline"]) == {
        f"reactive@{NODE}",
        f"avg@{NODE}",
        f"xgboost@{NODE}",
    }


def test_report_from_validate_outputs_only_notes_what_is_missing(world, tmp_path):
    out = tmp_path / "rep"
    assert cli("report", "--in", world["v_reactive"], world["v_avg"], "--out", out, "--bootstrap", "50") == 0
    p, text = parse(out / "report.html")
    assert p.sections == [sid for sid, _ in R.SECTIONS]
    assert len(p.images) == 2
    assert text.count("Not available") == 2  # fidelity and training
    assert "no fidelity output" in text and "no train output" in text


def test_report_names_the_code_that_made_it_and_each_input(world, tmp_path, monkeypatch):
    sha = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("HOUSE_BUNDLE_NAME", "house-dags")
    monkeypatch.setenv("HOUSE_BUNDLE_VERSION", sha)
    out = tmp_path / "rep"
    assert cli("report", "--in", world["v_reactive"], "--out", out, "--bootstrap", "50") == 0
    _, text = parse(out / "report.html")
    assert "Generated " in text and f"by mirage_tasks {R.__version__} (bundle house-dags at {sha}) from 1" in text
    assert f"(bundle house-dags at {sha})" in (out / "report.md").read_text()
    # the provenance table: a "code" column, each cell from that input's own marker
    validate_code = json.loads((Path(world["v_reactive"]) / "_SUCCESS.json").read_text()).get("code")
    assert "<th>code</th>" in text and f"<td>{provenance.describe(validate_code)}</td>" in text
    marker = json.loads((out / "_SUCCESS.json").read_text())
    assert marker["summary"]["code"]["bundle_version"] == sha and marker["code"]["bundle_version"] == sha


def test_report_needs_a_known_input(world, tmp_path, capsys):
    assert cli("report", "--in", world["dataset"], "--out", tmp_path / "r") == 2
    assert "none of the inputs" in capsys.readouterr().err
    assert cli("report", "--in", tmp_path / "missing", "--out", tmp_path / "r") == 2


def test_training_section_shows_search_history_and_thresholds(world, tmp_path):
    import pytest

    pytest.importorskip("optuna")
    d = tmp_path / "hpo"
    assert (
        cli(
            "train",
            "--model",
            "xgboost",
            "--dataset",
            world["dataset"],
            "--out",
            d,
            "--param",
            "n_estimators=10",
            "--threads",
            "1",
            "--val-fraction",
            "0.25",
            "--purge-days",
            "0",
            "--hpo-trials",
            "3",
        )
        == 0
    )
    out = tmp_path / "rep"
    assert cli("report", "--in", world["v_xgb"], world["v_reactive"], world["v_avg"], d, "--out", out) == 0
    md = (out / "report.md").read_text()
    assert "hyper-parameter search of xgboost" in md and (out / "figures" / "hpo_0.png").read_bytes()[:8] == PNG
    assert "Held-out scores and calibrated decision rules" in md
    never = json.load(open(out / "_SUCCESS.json"))["summary"]["never_submits"]
    for n in never:  # a learned model whose submissions were all forced is said so in the summary
        assert f"{n['model']} never submitted before the predecessor ended" in md
    decision = json.load(open(d / "config.json"))["decision"]
    low = decision["low_h"]
    row = next(line for line in md.splitlines() if line.startswith("| xgboost (hpo)"))
    assert ("never early" if low is None else R._fmt(float(low))) in row
    assert R._load_term(decision.get("load")) in row  # the load term of the rule, or '-'
    assert R._load_term({"feature": "queue_nodes", "slope": -0.5, "beta": -0.25}) == (
        "queue_nodes: slope -0.500 (beta -0.250)"
    )
    # the figure: one point per complete trial
    trials = json.load(open(d / "hpo_trials.json"))["trials"]
    assert R.hpo_figure("x", trials)[:8] == PNG and R.hpo_figure("x", []) is None


def test_report_names_its_dag_run_size_and_params_as_given(world, tmp_path):
    """A report made in a DAG run's prefix names the run (id, trigger, logical date), its size and its
    params as the user gave them, and shows step outputs below ``<run>`` instead of storage paths."""
    from datetime import datetime

    from mirage_tasks.run.runlog import RUNS_DIR, record_run
    from mirage_tasks.steps import report as step

    assert step.RUNS_DIR == RUNS_DIR

    prefix = tmp_path / "mirage_pipeline" / "manual-abc"
    defaults = {"size": "demo", "seed": 0, "trace": None}
    record_run(
        str(prefix),
        dag_id="mirage_pipeline",
        run_id="manual__2026-12-01T10:00:00+00:00",
        run_type="manual",
        logical_date=datetime(2026, 12, 1, 10, tzinfo=UTC),
        params={**defaults, "seed": 7},
        defaults=defaults,
    )
    out = prefix / "report"
    assert cli("report", "--in", world["v_reactive"], world["v_avg"], "--out", out, "--bootstrap", "50") == 0
    _, text = parse(out / "report.html")
    assert (
        "DAG run manual__2026-12-01T10:00:00+00:00 (manual, logical date 2026-12-01T10:00:00+00:00), size demo" in text
    )
    assert "Params as given: seed=7" in text
    summary = json.loads((out / "_SUCCESS.json").read_text())["summary"]
    assert summary["run_id"] == "manual__2026-12-01T10:00:00+00:00" and summary["size"] == "demo"
    md = (out / "report.md").read_text()
    assert "| seed * | 7 |" in md or "seed *" in md
    # outside a DAG run (no record beside the report) it says so
    alone = tmp_path / "alone"
    assert cli("report", "--in", world["v_reactive"], world["v_avg"], "--out", alone, "--bootstrap", "50") == 0
    assert "Not made by a DAG run" in (alone / "report.html").read_text()
