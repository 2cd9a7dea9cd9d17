"""pytest fixtures for the stand-in; import them into a test module to use them."""

from __future__ import annotations

import pytest

from kubeapi.server import KubeAPIServer

#: What the task images set (docker/*.Dockerfile) besides PATH/PYTHONPATH, plus one thread
#: per library: the test machines are small.
IMAGE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture
def kube_api(tmp_path, monkeypatch):
    """A started stand-in; ``kubernetes_default`` and ``KUBECONFIG`` point at it."""
    with KubeAPIServer(base_env=IMAGE_ENV) as api:
        path = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", api.connection_json(path))
        monkeypatch.setenv("KUBECONFIG", str(path))
        api.kubeconfig_path = path
        yield api


@pytest.fixture
def kube_client(kube_api):
    """A ``kubernetes.client.ApiClient`` for the stand-in (the unmodified client library)."""
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=str(kube_api.kubeconfig_path))
    yield api_client
    api_client.close()


__all__ = ["IMAGE_ENV", "kube_api", "kube_client"]
