"""The billing DaemonSet on the Kubernetes API stand-in: ``deploy``'s sampler runs once per
(fake) node as a local process, writes its samples to the results prefix, ``collect`` (a
fresh process, the unmodified ``kubernetes`` client) deletes it and summarizes per host,
and nothing is left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace as NS

import pytest
from kubeapi.fixtures import IMAGE_ENV
from kubeapi.server import KubeAPIServer

from faasm_tasks import billing
from faasm_tasks.results import Attempt, iter_records, point_prefix
from faasm_tasks.targets.knative import KnativeTarget, billing_daemonset, billing_spec
from stepkit import storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(180)


def test_billing_daemonset_on_the_standin(tmp_path):
    root = str(tmp_path / "results")
    run_id, date = "manual__2026-11-30T11:00:00+00:00", "2026-11-30"
    with KubeAPIServer(
        base_env={**IMAGE_ENV, "PYTHONPATH": REPO},
        nodes=("node-a", "node-b", "node-c"),
        node_labels={"node-a": {"faasm.io/role": "worker"}, "node-b": {"faasm.io/role": "worker"}},
    ) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        api.create("", "v1", "namespaces", "", {"metadata": {"name": "faasm"}})
        args = NS(
            run_id=run_id,
            results=root,
            date=date,
            billing_image="faasm-tasks:0.1.0",
            billing_node_selector=["faasm.io/role=worker"],
            billing_interval=0.3,
            billing_secret=None,
        )
        spec = billing_spec(args)
        assert spec["node_selector"] == {"faasm.io/role": "worker"}
        target = KnativeTarget(run_id=run_id, kubeconfig=str(kubeconfig), poll_s=0.2)
        doc = billing_daemonset(
            "faasm", run_id, spec["image"], spec["command"] + ["--flush-s", "0.5"], spec["node_selector"]
        )
        assert target._apply(doc, time.monotonic() + 30) == "created"
        pods = sorted(p["metadata"]["name"] for p in api.list("pods", "faasm"))
        assert pods == ["faasm-billing-node-a", "faasm-billing-node-b"]  # the selected nodes only
        base = storage.join(root, date, run_id, "billing")

        def samples_by_host() -> dict[str, list[dict]]:
            out: dict[str, list[dict]] = {}
            for rel in storage.list_files(base):
                if rel.endswith(".jsonl") and "/" in rel:
                    text = storage.read_bytes(storage.join(base, rel)).decode()
                    out.setdefault(rel.split("/")[0], []).extend(billing.read_samples(text)[1])
            return out

        def wait_for(cond, what: str) -> None:
            # conditions on what is stored, not windows: on a loaded machine a sample may come late
            deadline = time.time() + 120
            while True:
                got = samples_by_host()
                if set(got) == {"node-a", "node-b"} and cond(got):
                    return
                assert time.time() < deadline, (
                    what,
                    {h: len(r) for h, r in got.items()},
                    [api.pod_log("faasm", p) for p in pods],
                )
                time.sleep(0.3)

        wait_for(lambda got: True, "both nodes' samplers store samples")
        t0 = time.time()
        wait_for(
            lambda got: all(sum(r["t"] > t0 for r in rows) >= 2 for rows in got.values()),
            "two samples of each node inside the window",
        )
        t1 = time.time()
        wait_for(
            lambda got: all(any(r["t"] >= t1 for r in rows) for rows in got.values()),
            "a sample of each node after the window",
        )
        prefix = point_prefix(root, date, run_id, "sgd_reuters_svm", "wasm", {"n_workers": 2}, 0)
        Attempt(
            prefix,
            {
                "run_id": run_id,
                "date": date,
                "experiment": "sgd_reuters_svm",
                "system": "wasm",
                "target": "knative",
                "params": {"n_workers": 2},
                "repeat": 0,
            },
        ).finish(True, None, {"window": {"start": t0, "end": t1}})
        env = {**os.environ, "PYTHONPATH": REPO, "KUBECONFIG": str(kubeconfig)}
        # --date as the DAG passes it: without it a step takes today's date (UTC), not the run's
        common = [
            "--target",
            "knative",
            "--run-id",
            run_id,
            "--date",
            date,
            "--results",
            root,
            "--kubeconfig",
            str(kubeconfig),
            "--state-dir",
            str(tmp_path / "fresh-pod"),
        ]
        c = subprocess.run(
            [sys.executable, "-m", "faasm_tasks", "collect", *common],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert c.returncode == 0, c.stdout + c.stderr
        [(uri, rec)] = list(iter_records(root, date, run_id))
        summary = storage.read_json(storage.join(uri, "billing_summary.json"))
        assert sorted(h["host"] for h in summary["hosts"]) == ["node-a", "node-b"]
        assert all(h["complete"] and h["samples"] >= 4 for h in summary["hosts"]), summary
        assert not api.list("daemonsets", "faasm", group="apps") and not api.list("pods", "faasm")
        assert sorted(api.pods_deleted) == ["faasm/faasm-billing-node-a", "faasm/faasm-billing-node-b"]
        v = subprocess.run(
            [sys.executable, "-m", "faasm_tasks", "verify-clean", *common],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert v.returncode == 0, v.stdout + v.stderr
        left = api.objects_left()
        assert not [o for o in left if not o.startswith("Namespace")], left  # the platform's namespace only
