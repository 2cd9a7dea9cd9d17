"""External ids a step announces (Slurm job ids, Knative service names), kept across a task's retries.

A step prints ``stepkit-external: {"kind": ..., "ids": [...]}`` right after each external
submission (``stepkit.external``; the plugins never import the task packages, so the format is
read here from its text: tests/dags/test_keeper_adopt.py pins the two sides together). Both
runners keep every announced id in the task's state store (``task_state_store``, key
:data:`EXTERNAL_IDS_KEY`) as it arrives, so a killed try has recorded them, and pass them back to
a later try of the same task instance through the step's ``adopt_flag``
(``<adopt_flag> id,id,...``): the step adopts them instead of submitting again. The same store
Airflow's ``ResumableJobMixin`` keeps its one external id in; that mixin's submit-then-poll model
does not fit a step that submits many jobs itself.
"""

from __future__ import annotations

import json
import logging
from typing import Any

#: The prefix of a step's announcement of external ids (``stepkit.external.PREFIX``).
EXTERNAL_PREFIX = "stepkit-external: "
#: The task state store's key of the announced ids (renaming it breaks in-flight retries).
EXTERNAL_IDS_KEY = "external_ids"


def announced_ids(line: str, log: logging.Logger | Any | None = None) -> list[str] | None:
    """The ids of an announcement line; ``None`` for any other line (an unreadable announcement
    is logged and ignored: the step's output is no reason to fail its task)."""
    line = line.rstrip("\r\n")
    if not line.startswith(EXTERNAL_PREFIX):
        return None
    try:
        return [str(i) for i in json.loads(line[len(EXTERNAL_PREFIX) :])["ids"]]
    except (ValueError, KeyError, TypeError):
        if log is not None:
            log.warning("unreadable external-id announcement: %s", line)
        return None


class KeptIds:
    """The ids of one task instance: those an earlier try kept (read at the start) and those this
    try announces, written to the store whenever new ones arrive."""

    def __init__(self, store: Any, log: logging.Logger | Any):
        self.store = store
        self.log = log
        self.earlier = [str(i) for i in ((store.get(EXTERNAL_IDS_KEY) if store is not None else None) or [])]
        self.known = list(self.earlier)

    def adopt_args(self, adopt_flag: str | None) -> list[str]:
        """``[adopt_flag, "id,id"]`` when an earlier try kept ids and the step takes them, else ``[]``."""
        if not (self.earlier and adopt_flag):
            return []
        return [adopt_flag, ",".join(self.earlier)]

    def add(self, ids: list[str]) -> None:
        new = [i for i in dict.fromkeys(ids) if i not in self.known]
        if not new:
            return
        self.known.extend(new)
        if self.store is None:
            self.log.warning("external ids %s: no task state store, a retry cannot adopt them", new)
            return
        self.store.set(EXTERNAL_IDS_KEY, list(self.known))
        self.log.info("external ids kept for a retry: %s", ", ".join(self.known))
