"""The command lines of a mirage_pipeline run (mirage_tasks.run.plan): windows, fan-out, and the contract
that every argv the plan builds parses with its step's own parser."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mirage_tasks.run.plan import argv, plan, step_parser, windows
from mirage_tasks.run.runconf import MirageRun

BASE = dict(
    trace="",
    synth_profile="ls6-a100",
    cluster_config="ls6",
    train_start=None,
    train_count=684,
    val_start=None,
    val_count=None,
    interval_hours=4,
    warmup_days=2,
    workload_days=5,
    probes=7,
    node_sizes=[1, 8],
    shards=4,
    preset="quick",
    device="cpu",
    seed=0,
    train_params={},
    models=["xgboost", "random_forest", "transformer", "moe", "transformer_policy", "moe_policy"],
)
APRIL = datetime(2023, 4, 1, tzinfo=UTC)


def test_default_windows_validate_the_month_before():
    w = windows(MirageRun.from_params(BASE), APRIL)
    assert w["val_start"] == "2023-03-01T00:00:00+00:00"
    assert w["val_count"] == 156  # March, every workload ending inside the month: the seed's count
    # the last training sample's 5-day workload ends right before validation starts
    assert w["train_start"] == "2022-11-02T00:00:00+00:00" and w["train_count"] == 684


def test_pendulum_logical_date():
    import pendulum

    assert windows(MirageRun.from_params(BASE), pendulum.datetime(2023, 4, 1, tz="UTC"))["val_count"] == 156


def test_seed_configuration_and_leakage_refused():
    seed = dict(BASE, train_start="2022-11-01", val_start="2023-03-01", val_count=156)
    assert windows(MirageRun.from_params(seed), None)["train_start"] == "2022-11-01T00:00:00+00:00"
    with pytest.raises(ValueError, match="after val_start"):
        windows(MirageRun.from_params(dict(seed, train_start="2022-11-05")), None)
    with pytest.raises(ValueError, match="ISO 8601"):
        windows(MirageRun.from_params(dict(seed, val_start="March")), None)
    with pytest.raises(ValueError, match="logical date"):
        windows(MirageRun.from_params(BASE), None)


def test_fan_out_and_gpu_split():
    p = plan(MirageRun.from_params(BASE), "s3://b/run", APRIL)
    assert len(p["sample"]) == 8 and len(p["merge"]) == 2
    assert len(p["train_cpu"]) == 8 and not p["train_gpu"] and len(p["policy_cpu"]) == 4
    assert len(p["validate"]) == (6 + 2) * 2 * 4  # models + reactive/avg, node sizes, shards
    # 684 samples every 4 h from 2022-11-02: 114 trace days, in 4 chunks per node size
    assert len(p["days"]) == 114 and p["days"][0] == "2022-11-02"
    days0 = [p["sample"][0][i + 1] for i, a in enumerate(p["sample"][0]) if a == "--day"]
    assert days0 == p["days"][:29] and "--shard" not in p["sample"][0] and "--count" not in p["sample"][0]
    assert p["merge"][0][p["merge"][0].index("--count") + 1] == "684"
    assert p["trace_argv"][0] == "synth"
    g = plan(MirageRun.from_params(dict(BASE, device="cuda", train_params={"moe": ["epochs=3"]})), "s3://b/run", APRIL)
    assert {a[a.index("--model") + 1] for a in g["train_gpu"]} == {"transformer", "moe"}
    assert {a[a.index("--model") + 1] for a in g["train_cpu"]} == {"xgboost", "random_forest"}
    moe = next(a for a in g["train_gpu"] if "moe" in a)
    assert moe[moe.index("--param") + 1] == "epochs=3" and moe[moe.index("--device") + 1] == "cuda"
    sampled = [a for a in p["validate"] if "--stochastic" in a]
    assert {a[a.index("--name") + 1] for a in sampled} == {"transformer_policy", "moe_policy"}
    assert not any(
        "--stochastic" in a
        for a in plan(MirageRun.from_params(dict(BASE, policy_eval="greedy")), "/r", APRIL)["validate"]
    )
    assert p["fidelity"][p["fidelity"].index("--to") + 1] == "2023-03-27T00:00:00+00:00"  # 156 x 4 h
    assert "s3://b/run/fidelity" in p["report"]
    policy = g["policy_gpu"][0]
    assert policy[policy.index("--base") + 1].startswith("s3://b/run/models/")


def test_real_trace_and_bad_models():
    p = plan(
        MirageRun.from_params(
            dict(BASE, trace="/data/ls6.log", trace_timezone="America/Chicago", window_from="2022-11-01")
        ),
        "/r",
        APRIL,
    )
    out = p["trace_argv"][p["trace_argv"].index("--out") + 1]
    assert out.startswith("/mirage/traces/ingest-") and out == p["trace"]
    assert p["trace_argv"] == [
        "ingest",
        "--trace",
        "/data/ls6.log",
        "--out",
        out,
        "--from",
        "2022-11-01",
        "--timezone",
        "America/Chicago",
    ]
    with pytest.raises(ValueError, match="unknown"):
        plan(MirageRun.from_params(dict(BASE, models=["lstm"])), "/r", APRIL)
    with pytest.raises(ValueError, match="base model"):
        plan(MirageRun.from_params(dict(BASE, models=["moe_policy"])), "/r", APRIL)


# ----------------------------------------------------------------------------- the plan <-> step contract


def _dag_params() -> dict:
    """The mirage_pipeline DAG's params with their defaults, as the trigger form shows them."""
    from airflow.dag_processing.dagbag import DagBag
    from conftest import DAGS

    bag = DagBag(dag_folder=str(DAGS / "mirage_pipeline.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mirage_pipeline"].params


@pytest.fixture(scope="module")
def dag_defaults() -> dict:
    return _dag_params().dump()


def _makefile_demo_conf(synthetic: bool = False) -> dict:
    """The Makefile's DEMO_CONF as make expands it: as `make demo TRACE=... TRACE_TZ=...` does,
    or as plain `make demo` does (``synthetic``)."""
    import json

    from test_mirage_params import make_value

    trace = {} if synthetic else {"TRACE": "/data/demo-trace.log", "TRACE_TZ": "America/Chicago"}
    return json.loads(make_value("DEMO_CONF", **trace))


def _every_argv(p: dict) -> list[list[str]]:
    singles = [p["trace_argv"], p["fidelity"], p["metrics"], p["report"]]
    lists = [
        a
        for key in ("sample", "merge", "train_cpu", "train_gpu", "policy_cpu", "policy_gpu", "validate")
        for a in p[key]
    ]
    return singles + lists


@pytest.mark.parametrize(
    "case", ["dag_defaults_small", "makefile_demo", "makefile_demo_synthetic", "cuda", "real_trace"]
)
def test_every_argv_parses_with_its_steps_own_parser(dag_defaults, case):
    """Each argv of the plan parses with ``python -m mirage_tasks <step>``'s parser, no error."""
    small = {"train_count": 12, "val_count": 3, "shards": 2}
    params = {
        "dag_defaults_small": dict(dag_defaults, **small),
        "makefile_demo": dict(dag_defaults, **_makefile_demo_conf()),
        "makefile_demo_synthetic": dict(dag_defaults, **_makefile_demo_conf(synthetic=True)),
        "cuda": dict(dag_defaults, **small, device="cuda", train_params={"moe": ["epochs=3"]}),
        "real_trace": dict(
            dag_defaults,
            **dict(small, val_count=6),
            trace="/data/ls6.log",
            trace_timezone="America/Chicago",
            window_from="2022-10-01T00:00:00+00:00",
            val_start="2023-03-01",
        ),
    }[case]
    p = plan(MirageRun.from_params(params), "s3://bucket/mirage_pipeline/2023-04-01T000000Z", APRIL)
    argvs = _every_argv(p)
    assert len(argvs) > 10
    for a in argvs:
        step, rest = a[0], a[1:]
        parser = step_parser(step)
        parser.exit_on_error = False
        ns = parser.parse_args(rest)  # raises SystemExit (pytest fails) on any unknown or bad flag
        assert ns.out.startswith("s3://bucket/"), a
    if case == "cuda":
        assert p["train_gpu"] and p["policy_gpu"] and not p["policy_cpu"]


def test_argv_helper_uses_the_parsers_flags_and_refuses_unknown_keys():
    a = argv(
        "validate",
        trace="t",
        model="reactive",
        start="2023-03-01",
        count=3,
        node=1,
        out="o",
        stochastic=True,
        seed=None,
        threshold_h=None,
        interval_hours=4,
    )
    assert a[:3] == ["validate", "--trace", "t"] and "--stochastic" in a and "--seed" not in a
    assert a[a.index("--interval-hours") + 1] == "4" and "--decide-every-minutes" not in a  # the step's default
    assert argv("train", model="moe", param=["a=1", "b=2"], out="o")[3:] == [
        "--param",
        "a=1",
        "--param",
        "b=2",
        "--out",
        "o",
    ]
    assert argv("merge", inputs=["x", "y"], out="o") == ["merge", "--in", "x", "y", "--out", "o"]
    with pytest.raises(ValueError, match="no option for 'decide_every'"):
        argv("validate", decide_every=10)
    with pytest.raises(ValueError, match="unknown mirage_tasks step"):
        argv("nope")


def test_dag_model_enum_is_the_registry():
    """The form's model choices and the paper's models are the registry's."""
    from mirage_tasks.models.registry import KINDS
    from mirage_tasks.run.runconf import MirageRun

    params = _dag_params()
    models = params.get_param("models")
    assert models.schema["items"]["enum"] == list(KINDS) and models.schema["examples"] == list(KINDS)
    assert models.value is None and MirageRun().models == list(KINDS)  # empty: the size's models


def test_plan_module_imports_stdlib_only():
    import subprocess
    import sys

    code = (
        "import sys; import mirage_tasks.run.plan\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'pyarrow', 'airflow', 'fsspec') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_dag_defaults_are_the_steps_defaults(dag_defaults):
    """Where a run param mirrors a step flag, its default (the paper's) is the step's own."""
    from mirage_tasks.models.presets import PRESETS
    from mirage_tasks.run.runconf import DEFAULTS

    sample = step_parser("sample")
    for param in ("interval_hours", "warmup_days", "workload_days", "probes", "probe_spacing"):
        assert DEFAULTS[param] == sample.get_default(param), param
    for param in ("warmup_days", "workload_days", "probes", "probe_spacing"):  # not set by any size
        assert dag_defaults[param] == sample.get_default(param), param
    from mirage_tasks.sim.probes import PROBE_SPACINGS

    assert _dag_params().get_param("probe_spacing").schema["enum"] == list(PROBE_SPACINGS)
    assert dag_defaults["preset"] == DEFAULTS["preset"] == step_parser("train").get_default("preset")
    preset_enum = _dag_params().get_param("preset").schema["enum"]
    assert sorted(preset_enum) == sorted(PRESETS)


# ----------------------------------------------------------------------------- content-keyed storage


def test_locations_are_keyed_by_what_they_depend_on():
    from mirage_tasks.run.plan import run_key

    real = dict(BASE, trace="/data/ls6.log", trace_timezone="America/Chicago")
    run = MirageRun.from_params(real)
    p = plan(run, "/r/mirage_pipeline/x", APRIL, shared="/r/mirage", trace_fp="sha256:aa")
    # same content under another URI: the same ingested trace; sample families are named by the
    # trace's location (each day partition is checked against the content: mirage_tasks.data.prefixes)
    q = plan(
        MirageRun.from_params(dict(real, trace="s3://b/ls6.log")),
        "/r/mirage_pipeline/y",
        APRIL,
        shared="/r/mirage",
        trace_fp="sha256:aa",
    )
    assert p["trace"] == q["trace"] and p["families"] != q["families"]
    # other content (the trace grew in place), time zone or window: another ingested trace; the
    # same families for grown content; other sampling params: other families
    grown = plan(run, "/r/p", APRIL, shared="/r/mirage", trace_fp="sha256:bb")
    assert grown["trace"] != p["trace"] and grown["families"] == p["families"]
    assert (
        plan(
            MirageRun.from_params(dict(real, trace_timezone="UTC")),
            "/r/p",
            APRIL,
            shared="/r/mirage",
            trace_fp="sha256:aa",
        )["trace"]
        != p["trace"]
    )
    other = plan(MirageRun.from_params(dict(real, probes=5)), "/r/p", APRIL, shared="/r/mirage", trace_fp="sha256:aa")
    assert other["trace"] == p["trace"] and other["families"]["1"] != p["families"]["1"]
    assert p["families"]["1"] != p["families"]["8"]
    # models only: same samples, another run prefix
    fewer = dict(real, models=["xgboost"])
    assert (
        plan(MirageRun.from_params(fewer), "/r/p", APRIL, shared="/r/mirage", trace_fp="sha256:aa")["families"]
        == p["families"]
    )
    ident = {"kind": "ingest", "content": "sha256:aa"}
    assert run_key(run, APRIL, ident) == run_key(MirageRun.from_params(dict(real)), APRIL, ident)
    assert run_key(MirageRun.from_params(fewer), APRIL, ident) != run_key(run, APRIL, ident)
    assert run_key(run, APRIL, ident).startswith("2023-04-01T000000Z-")


def test_only_missing_days_are_sampled():
    p = plan(MirageRun.from_params(BASE), "/r/p", APRIL, shared="/r/mirage")
    have = set(p["days"][:100])
    q = plan(MirageRun.from_params(BASE), "/r/p", APRIL, shared="/r/mirage", have=lambda family, days: have)
    assert q["missing_days"]["1"] == p["days"][100:]
    days = [a[i + 1] for a in q["sample"] if "1" == a[a.index("--node") + 1] for i, x in enumerate(a) if x == "--day"]
    assert days == p["days"][100:]
    assert len(q["merge"][0][q["merge"][0].index("--in") + 1 : q["merge"][0].index("--start")]) == 114  # every day
    done = plan(MirageRun.from_params(BASE), "/r/p", APRIL, shared="/r/mirage", have=lambda family, days: set(days))
    assert done["sample"] == [] and len(done["merge"]) == 2


def test_next_month_reuses_most_days():
    """A monthly backfill: May's training window overlaps April's in all but ~a month of days."""
    april = plan(MirageRun.from_params(BASE), "/r/p", APRIL, shared="/r/mirage")
    may = plan(MirageRun.from_params(BASE), "/r/q", datetime(2023, 5, 1, tzinfo=UTC), shared="/r/mirage")
    assert may["families"] == april["families"]
    new = set(may["days"]) - set(april["days"])
    assert len(new) <= 31 and len(set(may["days"]) & set(april["days"])) >= 80


def test_workers_and_threads_reach_the_heavy_steps():
    p = plan(MirageRun.from_params(dict(BASE, train_count=12, val_count=3)), "/r/p", APRIL, workers=4, threads=4)
    assert all(a[a.index("--workers") + 1] == "4" for a in p["sample"] + p["validate"])
    assert all(a[a.index("--threads") + 1] == "4" for a in p["train_cpu"] + p["policy_cpu"])
    q = plan(MirageRun.from_params(dict(BASE, train_count=12, val_count=3)), "/r/p", APRIL)
    assert not any("--workers" in a for a in q["sample"] + q["validate"])


def test_samples_day_plan():
    from mirage_tasks.run.plan import newest_complete_day, samples_day, samples_trace

    params = dict(BASE, trace="/data/ls6.log", trace_timezone="America/Chicago")
    t = samples_trace(MirageRun.from_params(params), "/r/mirage", "2023-01-10", "sha256:aa")
    assert t["argv"][:3] == ["ingest", "--trace", "/data/ls6.log"] and "--from" not in t["argv"]  # the whole log
    d = samples_day(MirageRun.from_params(params), "/r/mirage", t, "2023-01-10")
    assert [a[a.index("--day") + 1] for a in d["sample"]] == ["2023-01-10", "2023-01-10"] and d["missing"] == [1, 8]
    # the pipeline's families on the same trace and grid are the same
    p = plan(MirageRun.from_params(params), "/r/mirage_pipeline/x", APRIL, shared="/r/mirage", trace_fp="sha256:aa")
    assert d["partitions"]["1"] == p["families"]["1"] + "/day=2023-01-10"
    done = samples_day(MirageRun.from_params(params), "/r/mirage", t, "2023-01-10", have=lambda family, days: set(days))
    assert done["sample"] == [] and set(done["partitions"]) == {"1", "8"}
    # a growing trace: the newest day whose samples' 5-day workloads the trace covers
    assert newest_complete_day("2023-04-01T04:54:55+00:00", 5) == "2023-03-26"
    # synthetic: one trace per month, shared by its days
    s1 = samples_trace(MirageRun.from_params(BASE), "/r/mirage", "2023-01-10")
    assert s1["trace"] == samples_trace(MirageRun.from_params(BASE), "/r/mirage", "2023-01-31")["trace"]
    assert s1["trace"] != samples_trace(MirageRun.from_params(BASE), "/r/mirage", "2023-02-01")["trace"]
    with pytest.raises(ValueError):
        samples_day(MirageRun.from_params(params), "/r/mirage", t, "10/01/2023")


# ----------------------------------------------------------------------------- mirage_monthly


def test_a_complete_month_starts_the_pipeline_run_that_validates_it():
    from mirage_tasks.run.plan import FAMILY_PARAMS, month_run

    fam = {
        "trace": "s3://b/ls6.log",
        "trace_timezone": "America/Chicago",
        "synth_profile": "ls6-a100",
        "cluster_config": "ls6",
        "interval_hours": 4,
        "warmup_days": 2,
        "workload_days": 5,
        "probes": 7,
        "probe_spacing": "uniform",
        "node_sizes": [1, 8],
        "seed": 0,
    }
    assert set(fam) == set(FAMILY_PARAMS)
    extras = [{"day": f"2023-02-{d:02d}", "params": fam} for d in range(1, 29)]
    run = month_run("2023-02", extras)
    assert run["logical_date"] == "2023-03-01T00:00:00+00:00" and run["run_id"] == "samples_complete__2023-02"
    assert run["conf"] == {"size": "paper", **fam}  # a full-size run on the days' sampling params
    # the pipeline accepts the conf and validates February on it (the month before its logical date)
    from datetime import datetime

    from mirage_tasks.run.plan import windows

    form = _dag_params()
    for k, v in run["conf"].items():  # the pipeline's param schema accepts the conf
        form[k] = v
    params = form.validate()
    w = windows(MirageRun.from_params(params), datetime(2023, 3, 1, tzinfo=UTC))
    assert w["val_start"] == "2023-02-01T00:00:00+00:00" and w["train_count"] == 684
    # it reads the days' partitions: the same sample families as mirage_samples wrote
    from mirage_tasks.run.plan import samples_day, samples_trace

    t = samples_trace(MirageRun.from_params(fam), "/r/mirage", "2023-02-10", "sha256:aa")
    p = plan(
        MirageRun.from_params(params),
        "/r/mirage_pipeline/x",
        datetime(2023, 3, 1, tzinfo=UTC),
        shared="/r/mirage",
        trace_fp="sha256:aa",
    )
    assert (
        samples_day(MirageRun.from_params(fam), "/r/mirage", t, "2023-02-10")["partitions"]["8"]
        == p["families"]["8"] + "/day=2023-02-10"
    )
    assert month_run("2023-12", extras)["logical_date"] == "2024-01-01T00:00:00+00:00"
    with pytest.raises(ValueError, match="different param sets"):
        month_run("2023-02", [*extras, {"params": dict(fam, probes=5)}])
    with pytest.raises(ValueError, match="do not record their params"):
        month_run("2023-02", [{"day": "2023-02-01"}])


# ----------------------------------------------------------------------------- one run configuration

#: The Makefile's demo before it became the ``demo`` size: DEMO_CONF, and DEMO_SYNTH on the
#: synthetic trace (both as they were written there).
OLD_DEMO = {
    "train_count": 30,
    "interval_hours": 12,
    "val_count": 6,
    "node_sizes": [1, 8],
    "shards": 2,
    "train_params": {"transformer_policy": ["epochs=4"], "moe_policy": ["epochs=4"]},
}
OLD_DEMO_SYNTH = {
    "window_from": "2023-01-01T00:00:00+00:00",
    "window_to": "2023-03-31T00:00:00+00:00",
    "val_start": "2023-02-11T00:00:00+00:00",
}
#: The DAG's defaults before sizes (the paper's configuration): what every run key was computed from.
OLD_DEFAULTS = {
    "trace": None,
    "window_from": None,
    "window_to": None,
    "trace_timezone": None,
    "synth_profile": "ls6-a100",
    "cluster_config": "ls6",
    "train_start": None,
    "train_count": 684,
    "val_start": None,
    "val_count": None,
    "interval_hours": 4,
    "warmup_days": 2,
    "workload_days": 5,
    "probes": 7,
    "probe_spacing": "uniform",
    "node_sizes": [1, 8],
    "shards": 4,
    "models": [
        "xgboost",
        "random_forest",
        "xgboost_quantile",
        "linear_quantile",
        "transformer",
        "moe",
        "transformer_policy",
        "moe_policy",
    ],
    "preset": "quick",
    "train_params": {},
    "device": "cpu",
    "policy_eval": "sampled",
    "seed": 0,
}


def _form(conf: dict) -> dict:
    """The mirage_pipeline form's values after a trigger with ``conf`` (checked by the form's schema)."""
    import copy

    params = copy.deepcopy(_dag_params())
    for k, v in conf.items():
        params[k] = v
    return params.validate()


def _plan_task(run_type: str, conf: dict, logical_date=APRIL):
    """The DAG's own ``plan.commands`` task run on a trigger's form values (no database)."""
    from types import SimpleNamespace

    from airflow.dag_processing.dagbag import DagBag
    from conftest import DAGS

    dag = DagBag(dag_folder=str(DAGS / "mirage_pipeline.py")).dags["mirage_pipeline"]
    task = dag.get_task("plan.commands")
    return task.python_callable(
        params=_form(conf),
        dag_run=SimpleNamespace(run_type=run_type),
        dag=dag,
        logical_date=logical_date,
        run_id=f"{run_type}__test",
    )


def test_storage_keys_of_the_paper_configuration_are_unchanged():
    """Committed outputs stay valid: the paper size (the former defaults) gives the run keys and
    sample families it always had (values computed before sizes existed)."""
    from mirage_tasks.run.plan import run_key, trace_identity
    from mirage_tasks.run.runconf import MirageRun

    paper = MirageRun.from_params(_form({"size": "paper"}))
    assert paper.key_params() == OLD_DEFAULTS
    assert run_key(paper, APRIL, trace_identity(paper)) == "2023-04-01T000000Z-85d52a42ea4b"
    real = MirageRun.from_params(
        _form({"size": "paper", "trace": "/data/ls6.log", "trace_timezone": "America/Chicago"})
    )
    assert run_key(real, APRIL, trace_identity(real, "sha256:aa")) == "2023-04-01T000000Z-6364ef39a127"
    assert (
        run_key(
            MirageRun.from_params(dict(OLD_DEFAULTS, trace="/data/ls6.log", trace_timezone="America/Chicago")),
            APRIL,
            trace_identity(real, "sha256:aa"),
        )
        == "2023-04-01T000000Z-6364ef39a127"
    )
    p = plan(real, "/r/p", APRIL, shared="/r/mirage", trace_fp="sha256:aa")
    assert p["trace"] == "/r/mirage/traces/ingest-0a99dd7fcae108c3"
    assert p["families"] == {
        "1": "/r/mirage/samples/node1-08b68ac85fefc5ee",
        "8": "/r/mirage/samples/node8-ed80663a7bc2c9af",
    }
    synth = plan(paper, "/r/p", APRIL, shared="/r/mirage")
    assert synth["trace"] == "/r/mirage/traces/synth-9abb5a0d653efd3f"
    assert synth["families"] == {
        "1": "/r/mirage/samples/node1-844576b500350e35",
        "8": "/r/mirage/samples/node8-6c226210bf5abfae",
    }
    # a scheduled run: the DAG's own plan task, whatever size the form says
    scheduled = _plan_task("scheduled", {})
    assert scheduled["config"]["size"] == "scheduled" and scheduled["prefix"].endswith(
        "/2023-04-01T000000Z-943569fab9f8"
    )
    assert scheduled["windows"]["train_count"] == 42 and scheduled["windows"]["val_count"] == 12


@pytest.mark.parametrize("synthetic", [True, False])
def test_size_demo_is_the_makefiles_former_demo(synthetic):
    """``{"size": "demo"}`` (what `make demo` now sends) plans exactly what the hand-copied
    DEMO_CONF planned: same params, windows and every argv."""
    from mirage_tasks.run.runconf import MirageRun

    conf = _makefile_demo_conf(synthetic)
    assert conf["size"] == "demo" and set(conf) <= {"size", "trace", "trace_timezone"}
    old = dict(
        OLD_DEFAULTS,
        **OLD_DEMO,
        **(OLD_DEMO_SYNTH if synthetic else {}),
        **{k: v for k, v in conf.items() if k != "size"},
    )
    new = MirageRun.from_params(_form(conf))
    assert new.key_params() == old
    date = datetime(2026, 12, 1, tzinfo=UTC)  # a manual trigger today
    p, q = (
        plan(new, "/r/p", date, shared="/r/mirage"),
        plan(MirageRun.from_params(old), "/r/p", date, shared="/r/mirage"),
    )
    assert p.pop("config")["size"] == "demo" and q.pop("config")["size"] == "paper"
    assert p == q
    if synthetic:  # pinned windows: the same run whatever the logical date
        assert p["windows"]["val_start"] == "2023-02-11T00:00:00+00:00" and p["windows"]["val_count"] == 6
        assert plan(new, "/r/p", APRIL, shared="/r/mirage")["validate"] == p["validate"]
        assert p["trace_argv"][p["trace_argv"].index("--from") + 1] == "2023-01-01T00:00:00+00:00"
    else:  # a real trace: the month before the logical date, as always
        assert p["windows"]["val_start"] == "2026-11-01T00:00:00+00:00"
    assert len(p["train_cpu"]) == 12 and len(p["policy_cpu"]) == 4 and len(p["validate"]) == 10 * 2 * 2


def test_explicit_params_win_over_the_size():
    from mirage_tasks.run.runconf import MirageRun

    run = MirageRun.from_params(
        _form(
            {
                "size": "demo",
                "train_count": 12,
                "val_start": "2023-02-20T00:00:00+00:00",
                "models": ["xgboost"],
                "train_params": {},
            }
        )
    )
    assert (run.train_count, run.val_start, run.models, run.train_params) == (
        12,
        "2023-02-20T00:00:00+00:00",
        ["xgboost"],
        {},
    )
    assert (run.interval_hours, run.val_count, run.window_from) == (12, 6, "2023-01-01T00:00:00+00:00")  # the demo's
    month = MirageRun.from_params(_form({"size": "month"}))
    assert (month.train_count, month.val_count, month.interval_hours, month.models) == (
        180,
        None,
        4,
        OLD_DEFAULTS["models"],
    )
    w = windows(month, APRIL)
    assert w["val_count"] == 156 and w["train_count"] == 180 and w["val_start"] == "2023-03-01T00:00:00+00:00"


@pytest.mark.parametrize(
    "conf, param",
    [
        ({"val_start": "March"}, "val_start"),
        ({"train_params": {"xgboost": "n_estimators=5"}}, "train_params"),
        ({"train_params": {"lstm": ["a=1"]}}, "train_params"),
        ({"models": ["moe_policy", "xgboost"]}, "models"),
        ({"window_to": "2023-13-01"}, "window_to"),
    ],
)
def test_a_bad_value_fails_the_plan_naming_the_param(conf, param):
    """Values the form's schema lets through but the run cannot use fail the DAG's plan task
    for good (no retry), with the param named."""
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=f"param {param}"):
        _plan_task("manual", conf)
