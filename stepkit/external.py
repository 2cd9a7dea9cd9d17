"""External jobs a step started (Slurm job ids, Knative service names), announced on stdout so
the runner that started the step can keep them across a retry.

A step calls :func:`announce` right after each external submission; the line it prints,
``stepkit-external: {"kind": "slurm", "ids": ["1234"]}``, is read by the house operator (the
Airflow side; this package never imports Airflow), which stores the ids in the task's state
store and, when the task is retried, passes them back through the step's adopt flag
(``keep-service --adopt-jobs 1234,1240``), so the retried step adopts them instead of
submitting again. :func:`parse_ids` reads that flag's value.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterable

from .errors import StepError

#: The prefix of an announcement line (``house.local`` reads the same text).
PREFIX = "stepkit-external: "
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
_lock = threading.Lock()


def announce(kind: str, ids: Iterable[str]) -> None:
    """Print one announcement line for ``ids`` of ``kind`` and a plain line after it (flushed at
    once: a step killed right after has told its runner)."""
    ids = [str(i) for i in ids]
    bad = [i for i in ids if not _ID.match(i)]
    if bad or not _ID.match(kind):
        raise ValueError(f"external ids must be plain names: kind {kind!r}, ids {bad}")
    with _lock:
        # the second line is for a runner that reads the step's log from Kubernetes: the provider
        # hands on a line only once the next one begins (it joins continuation lines)
        sys.stdout.write(PREFIX + json.dumps({"kind": kind, "ids": ids}) + "\n")
        sys.stdout.write(f"announced {kind}: {', '.join(ids)}\n")
        sys.stdout.flush()


def parse_ids(text: str | None, flag: str) -> list[str]:
    """The ids of an adopt flag's value (comma-separated, order kept, duplicates dropped);
    :class:`StepError` naming ``flag`` for anything that is not a plain id."""
    out: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if not _ID.match(item):
            raise StepError(f"{flag} {text!r}: {item!r} is not a job id")
        if item not in out:
            out.append(item)
    return out
