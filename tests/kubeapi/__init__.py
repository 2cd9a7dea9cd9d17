"""A Kubernetes API server stand-in for tests (see :mod:`kubeapi.server`)."""

from kubeapi.server import KubeAPIServer, label_matcher

__all__ = ["KubeAPIServer", "label_matcher"]
