"""Cluster operations behind one interface: ``knative`` (Kubernetes) and ``local`` (127.0.0.1)."""

from __future__ import annotations

from typing import Any

from stepkit import StepError

from .base import Endpoints, Target

TARGETS = ("local", "knative")


def get_target(name: str, args: Any) -> Target:
    if name == "local":
        from .local import LocalTarget

        return LocalTarget.from_args(args)
    if name == "knative":
        from .knative import KnativeTarget

        return KnativeTarget.from_args(args)
    raise StepError(f"unknown target {name!r}; choose from {', '.join(TARGETS)}")


__all__ = ["TARGETS", "Endpoints", "Target", "get_target"]
