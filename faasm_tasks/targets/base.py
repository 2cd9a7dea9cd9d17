"""The operations every target provides."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Endpoints:
    """Where clients go: one invoke URL with Host-header routing, one upload URL."""

    invoke_url: str
    upload_url: str
    protocol: str = "knative"  # or "planner"
    domain: str = "faasm.example.com"
    extra: dict[str, Any] = field(default_factory=dict)

    def host_for(self, name: str) -> str:
        """Knative routing Host for a service name (``_`` becomes ``-``)."""
        return f"faasm-{name.replace('_', '-')}.{self.domain}"


class Target(abc.ABC):
    name: str

    @abc.abstractmethod
    def deploy(self, plan) -> dict[str, Any]: ...

    @abc.abstractmethod
    def wait_ready(self, timeout_s: float) -> dict[str, Any]: ...

    @abc.abstractmethod
    def soft_restart(self, timeout_s: float) -> dict[str, Any]: ...

    @abc.abstractmethod
    def endpoints(self) -> Endpoints: ...

    @abc.abstractmethod
    def flush_queue(self) -> int: ...

    @abc.abstractmethod
    def delete_state_keys(self, patterns: list[str]) -> int: ...

    @abc.abstractmethod
    def teardown(self, run_state_keys: list[str], timeout_s: float, full: bool = False) -> dict[str, Any]: ...

    @abc.abstractmethod
    def verify_clean(self, run_state_keys: list[str]) -> dict[str, Any]: ...

    def health(self) -> str | None:
        """None while the deployment looks alive, else what is wrong (e.g. a dead worker).
        ``run`` calls it while it waits for a call, so a crash fails the point in seconds."""
        return None

    def describe(self) -> dict[str, Any]:
        """Images, versions and endpoints for the run record."""
        return {"target": self.name}
