"""The workload registry: one row per kind, one name per kind, no kind if-chains elsewhere."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest

from faasm_tasks import workloads
from faasm_tasks.catalogue import get_experiment, load_catalogue, resolve, validate
from stepkit import StepError

ROOT = Path(__file__).resolve().parents[2]
# a comparison of a workload (or its data kind) with a literal: the dispatch the registry replaces
KIND_TEST = re.compile(r"""(workload|\bwl|\["kind"\]|\bkind)\b["'\]]*\s*(==|!=|\bin\b)\s*[("'\[]""")
KIND_LITERAL = re.compile(r"""(==|!=)\s*["'](sgd|matmul|matrix|inference|tf)["']""")


def _sources():
    for folder in ("faasm_tasks", "dags", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "workloads.py" and "mirage" not in path.name:
                yield path


def test_no_workload_comparison_outside_the_registry():
    found = []
    for path in _sources():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if (KIND_TEST.search(code) and "workload" in code) or KIND_LITERAL.search(code):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "dispatch on a workload name outside faasm_tasks/workloads.py:\n" + "\n".join(found)


def test_the_probe_finds_what_it_forbids():
    for bad in ('if plan.experiment["workload"] == "sgd":', 'if wl == "matmul":', "elif kind == 'tf':"):
        assert KIND_TEST.search(bad) or KIND_LITERAL.search(bad), bad


def test_every_catalogue_experiment_names_a_row_and_every_row_its_c_source():
    for name, exp in load_catalogue(packaged_only=True).items():
        assert exp["workload"] in workloads.WORKLOADS, name  # the one name, not an alias
        assert "kind" not in exp["data"], f"{name}: the data kind is the workload's"
    functions = ROOT / "faasm_tasks" / "functions"
    for row in workloads.WORKLOADS.values():
        for fn in row.functions:
            assert (functions / f"{fn}.c").is_file(), f"{row.name}: {fn}.c"
        assert set(row.modules.values()) <= set(row.functions), row.name
        for hook in ("prepare", "request", "budget", "verify", "result"):
            if getattr(row, hook):
                assert callable(row.hook(hook)), (row.name, hook)


def test_old_names_still_load_and_a_mismatched_data_kind_is_refused():
    exp = copy.deepcopy(get_experiment("matrix_multiplication"))
    exp.pop("_source")
    exp["data"]["kind"] = "matrix"  # the data kind before the registry
    validate(exp)
    tf = copy.deepcopy(get_experiment("tf_inference_latency"))
    tf.pop("_source")
    tf["workload"], tf["data"]["kind"], tf["driver"]["kind"] = "image", "tf", "load"
    validate(tf)
    assert resolve(tf, "native", "knative").workload.name == "inference"
    exp["data"]["kind"] = "tf"
    with pytest.raises(StepError, match="data/kind 'tf' is not workload 'matmul'"):
        validate(exp)
    tf["driver"]["kind"] = "call"
    with pytest.raises(StepError, match="inference is a load workload"):
        validate(tf)


def test_driver_defaults_are_applied_once_at_resolve():
    sgd = resolve(get_experiment("sgd_reuters_svm"), "wasm", "knative")
    assert sgd.driver.kind == "call" and sgd.driver.poll_interval_ms == 1000 and sgd.driver.warmup_s == 10.0
    tpt = resolve(get_experiment("tf_inference_throughput"), "native", "local")
    assert tpt.driver.warmup_s == 1.0 and tpt.driver.connections == 4 and tpt.driver.threads == 1
    assert tpt.driver.ready_timeout_s == 120.0 and tpt.driver.send_lag_p99_ms == 5.0


def test_time_budgets_come_from_the_registry():
    cat = load_catalogue(packaged_only=True)
    assert workloads.time_budget_s(cat["sgd_reuters_svm"]) == 2 * 3600
    assert workloads.time_budget_s(cat["tf_inference_throughput"]) == 6 * 3600
    assert workloads.time_budget_s(cat["tf_inference_latency"]) == 3 * 3600  # its own time_budget_h
    assert workloads.run_timeout_s(cat["tf_inference_throughput"]) == 6 * 3600 + 0.1 * 6 * 3600


@pytest.mark.parametrize(
    "value, message", [("two", "is an integer"), ("2.5", "is an integer"), ("-3", "cannot be negative")]
)
def test_set_values_are_checked_against_the_catalogue(value, message):
    from faasm_tasks.common import parse_set

    with pytest.raises(StepError, match=f"--set n_workers={value}: sgd_reuters_svm's n_workers {message}"):
        resolve(get_experiment("sgd_reuters_svm"), "wasm", "local", parse_set([f"n_workers={value}"]))
    with pytest.raises(StepError, match="duration_s is an integer"):
        resolve(get_experiment("tf_inference_latency"), "wasm", "local", parse_set(["duration_s=soon"]))
    assert (
        resolve(get_experiment("tf_inference_latency"), "wasm", "local", parse_set(["duration_s=2"])).points[0][
            "duration_s"
        ]
        == 2
    )


def test_a_sweep_variant_that_does_nothing_on_the_local_target_is_refused():
    exp = get_experiment("tf_inference_throughput")
    with pytest.raises(StepError, match="--sweep-variant extended .*tf_sweep.* does nothing on the local target"):
        resolve(exp, "wasm", "local", variant="extended")
    assert len(resolve(exp, "wasm", "knative", variant="extended").points) == 14
    resolve(exp, "wasm", "local", variant="default")


def test_missing_or_corrupt_builds_are_named(tmp_path, monkeypatch):
    from faasm_tasks import runtimes

    build = tmp_path / "build"
    (build / "wasm").mkdir(parents=True)
    (build / "wasm" / "sgd.wasm").write_bytes(b"not wasm at all")
    problems = runtimes.build_problems("wasm", str(build))
    assert any("sgd.wasm is not a WebAssembly module" in p for p in problems)
    assert any(p.endswith("matmul.wasm missing") for p in problems)
    from faasm_tasks.data import check_wasm

    with pytest.raises(StepError, match="broken.wasm is not a WebAssembly module"):
        check_wasm(b"\x7fELF....", "broken.wasm")
    check_wasm(b"\0asm\x01\0\0\0", "fine.wasm")


def test_local_deploy_without_built_functions_names_make_functions(tmp_path, monkeypatch):
    from faasm_tasks import runtimes
    from faasm_tasks.runtimes import common
    from faasm_tasks.targets.local import LocalTarget

    monkeypatch.setattr(common, "BUILD_DIR", str(tmp_path / "nothing"))
    monkeypatch.setattr(runtimes.build_problems, "__defaults__", (str(tmp_path / "nothing"),))
    plan = resolve(get_experiment("sgd_reuters_svm"), "wasm", "local")
    with pytest.raises(StepError, match=r"functions are not built: .*sgd.wasm missing.*run `make functions`"):
        LocalTarget(str(tmp_path / "state"), "nofunc").deploy(plan)
    assert not os.path.exists(tmp_path / "state" / "nofunc" / "local" / "state.json")


def test_load_flags_that_do_nothing_are_refused_naming_them():
    from types import SimpleNamespace

    from faasm_tasks.points import refuse_inert

    def args(**kw):
        return SimpleNamespace(**{"mode": None, "rate": None, "threads": None, "driver": "builtin", **kw})

    sgd = resolve(get_experiment("sgd_reuters_svm"), "wasm", "local")
    with pytest.raises(StepError, match=r"--rate, --threads: sgd_reuters_svm is a call workload"):
        refuse_inert(args(rate=10.0, threads=2), sgd)
    with pytest.raises(StepError, match="--driver: sgd_reuters_svm is a call workload"):
        refuse_inert(args(driver="wrk"), sgd)
    refuse_inert(args(), sgd)
    lat = resolve(get_experiment("tf_inference_latency"), "wasm", "local")
    with pytest.raises(StepError, match="--rate does nothing in closed loop"):
        refuse_inert(args(rate=10.0), lat)
    with pytest.raises(StepError, match="open-loop mode needs --rate"):
        refuse_inert(args(mode="open"), lat)
    refuse_inert(args(mode="open", rate=10.0, threads=2, driver="wrk"), lat)
