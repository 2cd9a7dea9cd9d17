"""A workload kind added without editing any other file: its row, its C source and its YAML.

This file plays the kind's own module and its test at once, as tests/mirage/test_model_family.py
does for a model family: ``sumsq`` (the sum of i * i for i < n, in C) declares its data
preparation (none), what a call sends, the metrics read from the output, its check (exact
integers from Python) and its time bound here. Its row reaches the local target's workers
through ``FAASM_WORKLOADS`` (the registry's plug-in rows), its C source is built by the
package's own ``faasm_tasks/functions/Makefile`` (``FUNCS`` is every C source; here through
``VPATH`` into a temporary build folder, ``FAASM_FUNCTIONS_BUILD_DIRS``) and its experiment is
a YAML file in a ``--catalogue-dir``. Then it goes through the normal steps: deploy,
wait-ready, upload-data, run (a point whose result overflows the C function's uint32 fails its
check, and so fails the point), teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from faasm_testutil import ROOT, needs_local_target

from faasm_tasks import workloads
from faasm_tasks.points import Check, Request

KIND = "sumsq"

# ----------------------------------------------------------------------------- the kind's own module

C_SOURCE = r"""
#include "faasm.h"
#include <stdio.h>
#include <stdlib.h>

FAASM_EXPORT("faasm_main") int32_t faasm_main(int32_t index) {
    (void)index;
    char in[32];
    int32_t n = faasm_input((uint8_t *)in, sizeof in - 1);
    if (n < 0) n = 0;
    if (n > (int32_t)sizeof in - 1) n = sizeof in - 1;
    in[n] = 0;
    uint32_t sum = 0; /* overflows past n = 2345: the check catches it */
    for (long i = 0, k = atol(in); i < k; i++) sum += (uint32_t)(i * i);
    char out[32];
    snprintf(out, sizeof out, "%u", sum);
    faasm_output_str(out);
    return 0;
}
"""

YAML = """\
name: sum_of_squares
description: The sum of squares below n, in C (a test's workload kind).
workload: sumsq
user: calc
function: sumsq
systems: [wasm]
driver: {poll_interval_ms: 50, call_timeout_s: 60}
sweep:
  wasm:
    - {param: n, values: [10, 1000, 3000]}
deploy:
  wasm: {worker_replicas: 1}
data: {}
local:
  workers: 1
"""


def prepare(plan, client, source, s3, synthetic, force):
    return []


def request(ctx, point):
    return Request(ctx.plan.experiment["user"], ctx.plan.experiment["function"], str(int(point["n"])))


def result(ctx, point, res):
    return {"sum": int(res.output.split(":", 1)[1]) if res.output.startswith("SUCCESS") else int(res.output)}


def verify(ctx, point, res, metrics):
    n = int(point["n"])
    want = (n - 1) * n * (2 * n - 1) // 6
    return Check(metrics["sum"] == want, "the exact sum of squares", value=metrics["sum"], reference=want)


def budget(point, driver):
    return 30.0


# ----------------------------------------------------------------------------- its registry row
ROW = workloads.Workload(
    KIND,
    "call",
    f"{__name__}:prepare",
    f"{__name__}:request",
    f"{__name__}:budget",
    verify=f"{__name__}:verify",
    result=f"{__name__}:result",
    time_budget_h=0.1,
    modules={("calc", "sumsq"): KIND},
    functions=(KIND,),
)


@pytest.fixture
def sumsq():
    workloads.register(ROW)
    yield ROW
    workloads.unregister(KIND)


def test_the_row_is_a_workload_everywhere_it_is_looked_up(sumsq, tmp_path):
    from faasm_tasks.catalogue import load_catalogue, resolve

    (tmp_path / "sum_of_squares.yaml").write_text(YAML)
    plan = resolve(load_catalogue([str(tmp_path)])["sum_of_squares"], "wasm", "local")
    assert plan.workload is ROW and plan.driver.kind == "call" and plan.driver.warmup_s == 10
    assert [p["n"] for p in plan.points] == [10, 1000, 3000]
    assert workloads.modules()[("calc", "sumsq")] == KIND
    assert workloads.run_timeout_s(plan.experiment) == 60 * 21  # 6 min budget + 15 min margin


def test_without_the_row_the_yaml_is_refused(tmp_path):
    from faasm_tasks.catalogue import load_catalogue
    from stepkit import StepError

    (tmp_path / "sum_of_squares.yaml").write_text(YAML)
    with pytest.raises(StepError, match="unknown workload 'sumsq'"):
        load_catalogue([str(tmp_path)])


@needs_local_target
def test_a_new_kind_runs_through_the_steps_on_the_local_target(tmp_path):
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    (src / f"{KIND}.c").write_text(C_SOURCE)
    functions = os.path.join(ROOT, "faasm_tasks", "functions")
    for target in (f"{build}/wasm/{KIND}.wasm", f"{build}/native/{KIND}"):
        subprocess.run(
            ["make", "-s", "-C", functions, f"B={build}", f"VPATH={src}", target],
            check=True,
            capture_output=True,
            timeout=120,
        )
    cat = tmp_path / "catalogue"
    cat.mkdir()
    (cat / "sum_of_squares.yaml").write_text(YAML)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(__file__)]),
        FAASM_WORKLOADS=f"{__name__}:ROW",
        FAASM_FUNCTIONS_BUILD_DIRS=str(build),
        FAASM_CATALOGUE_DIR=str(cat),
        FAASM_TASKS_STATE_DIR=str(tmp_path / "state"),
    )
    results = f"file://{tmp_path}/results"
    common = ["--target", "local", "--run-id", "kind", "--results", results, "--date", "2026-12-02"]

    def step(*args, check=True):
        p = subprocess.run(
            [sys.executable, "-m", "faasm_tasks", *args, *common, "--log-level", "WARNING"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert not check or p.returncode == 0, f"{args[0]} exited {p.returncode}: {p.stdout}{p.stderr[-3000:]}"
        return p

    exp = ["--experiment", "sum_of_squares", "--system", "wasm"]
    try:
        step("deploy", *exp)
        step("wait-ready", "--timeout", "60")
        step("upload-data", *exp)
        run = step("run", *exp, check=False)
    finally:
        step("teardown", check=False)
    assert run.returncode == 1, run.stdout + run.stderr  # the overflowing point failed its check
    from faasm_tasks.results import iter_records

    recs = {r["params"]["n"]: r for _, r in iter_records(results, "2026-12-02", "kind")}
    assert {n: r["status"] for n, r in recs.items()} == {10: "succeeded", 1000: "succeeded", 3000: "failed"}
    assert recs[1000]["metrics"]["sum"] == 332833500 and recs[1000]["metrics"]["check"]["ok"] is True
    bad = recs[3000]
    assert bad["metrics"]["check"]["ok"] is False and bad["metrics"]["check"]["reference"] == 8995500500
    assert "check failed: the exact sum of squares" in bad["outcome"]["error"], json.dumps(bad["outcome"])
