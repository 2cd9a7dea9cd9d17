"""The labels of mapped step instances come from the plan (mirage_tasks.run.plan), computed from the
values each argv is built from, and the DAGs show them without reading argv.

``argv_label`` below is how ``dags/mirage_pipeline.py`` (``step_label``) and
``dags/mirage_samples.py`` (``node_label``) built the labels before, by parsing each argv: every
label the plan returns must be the text those gave for the argv at the same index."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from conftest import DAGS

from mirage_tasks.run.plan import MAPPED_STEPS, plan, sample_argvs, samples_day, samples_trace, step_label
from mirage_tasks.run.runconf import MirageRun

APRIL = datetime(2023, 4, 1, tzinfo=UTC)
BASE = dict(
    trace="",
    synth_profile="ls6-a100",
    cluster_config="ls6",
    train_start=None,
    train_count=12,
    val_start=None,
    val_count=3,
    interval_hours=4,
    warmup_days=2,
    workload_days=5,
    probes=7,
    node_sizes=[1, 8],
    shards=2,
    preset="quick",
    device="cpu",
    seed=0,
    train_params={},
    models=["xgboost", "random_forest", "transformer", "moe", "transformer_policy", "moe_policy"],
)
REAL = {"trace": "/data/ls6.log", "trace_timezone": "America/Chicago"}


def argv_label(argv: list[str]) -> str:
    """The label the DAGs derived from an argv before the plan emitted labels (reference only)."""
    val = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    days = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--day"]
    node = val.get("--node") or next(
        (seg[4:] for seg in val.get("--out", "").split("/") if seg.startswith("node") and seg[4:].isdigit()), None
    )
    parts = [
        val.get("--name") or val.get("--model"),
        f"node {node}" if node else None,
        (f"{days[0]}..{days[-1]} ({len(days)} d)" if len(days) > 1 else days[0]) if days else None,
        f"shard {val['--shard']}" if "--shard" in val else None,
    ]
    return " · ".join(p for p in parts if p) or argv[0]


@pytest.mark.parametrize(
    "conf",
    [
        {},
        {"shards": 1},
        {"shards": 4, "train_count": 60},
        {"device": "cuda"},
        {"node_sizes": [1, 2, 8], "models": ["xgboost", "transformer", "transformer_policy"]},
        REAL,
    ],
    ids=["base", "one_shard", "four_shards", "cuda", "three_nodes", "real_trace"],
)
def test_every_mapped_argv_has_the_label_its_values_give(conf):
    p = plan(MirageRun.from_params(dict(BASE, **conf)), "/r/p", APRIL, shared="/r/mirage", trace_fp="sha256:aa")
    assert set(p["labels"]) == set(MAPPED_STEPS)
    for key in MAPPED_STEPS:
        assert len(p["labels"][key]) == len(p[key]), key
        assert p["labels"][key] == [argv_label(a) for a in p[key]], key
    assert p["workload_days"] == 5  # the value missing_days checks committed days with


def test_labels_read_as_before():
    p = plan(MirageRun.from_params(BASE), "/r/p", APRIL)
    assert len(p["days"]) == 2
    assert p["labels"]["sample"][0] == f"node 1 · {p['days'][0]}"
    one = plan(MirageRun.from_params(dict(BASE, shards=1)), "/r/p", APRIL)
    assert one["labels"]["sample"][-1] == f"node 8 · {p['days'][0]}..{p['days'][1]} (2 d)"
    assert p["labels"]["merge"] == ["node 1", "node 8"]
    assert p["labels"]["train_cpu"][0] == "xgboost · node 1"
    assert p["labels"]["policy_cpu"][-1] == "moe_policy · node 8"
    assert p["labels"]["validate"][-1] == "avg · node 8 · shard 1/2"
    assert step_label(node=1, days=["1997-01-03", "1997-01-09"]) == "node 1 · 1997-01-03..1997-01-09 (2 d)"
    assert step_label(shard="2") == "shard 2" and step_label() == ""


def test_missing_days_keep_their_labels():
    """After ingest the DAG lists the missing days again (sample_argvs): labels follow the chunks."""
    p = plan(MirageRun.from_params(dict(BASE, train_count=60, shards=3)), "/r/p", APRIL)
    first = p["days"][0]
    argvs, labels, missing = sample_argvs(p, have=lambda family, days: {first})
    assert missing["1"] == p["days"][1:] and len(argvs) == len(labels) == 6
    assert labels == [argv_label(a) for a in argvs]
    assert all(first not in label for label in labels)


def test_samples_day_labels():
    run = MirageRun.from_params(dict(BASE, **REAL))
    t = samples_trace(run, "/r/mirage", "2023-01-10", "sha256:aa")
    d = samples_day(run, "/r/mirage", t, "2023-01-10")
    assert d["labels"]["sample"] == ["node 1 · 2023-01-10", "node 8 · 2023-01-10"]
    assert d["labels"]["sample"] == [argv_label(a) for a in d["sample"]]
    done = samples_day(run, "/r/mirage", t, "2023-01-10", have=lambda family, days: set(days))
    assert done["sample"] == done["labels"]["sample"] == []


#: What reading a value back out of an argv looks like: a flag looked up or tested for, or the
#: plan's argv values indexed into.
ARGV_PARSING = re.compile(r"""\.index\(\s*["']--|startswith\(\s*["']--|\[\s*["']argv["']\s*\]\s*\[""")


def test_dags_do_not_parse_argv():
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(DAGS.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ARGV_PARSING.search(line)
    ]
    assert not found, found
    assert ARGV_PARSING.search("argv[argv.index('--node') + 1]")
    assert ARGV_PARSING.search('p["sample_jobs"][0]["argv"]["workload_days"]')
