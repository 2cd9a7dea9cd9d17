"""The one ISO 8601 time helper of the Mirage steps (stdlib only, so the plan can use it too)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def iso(t: Any) -> str:
    """``YYYY-MM-DDTHH:MM:SS+00:00`` (UTC) of epoch seconds (int, float, numpy scalar) or a datetime.

    Epoch seconds are truncated to whole seconds; a naive datetime is taken as UTC.
    """
    if isinstance(t, dt.datetime):
        t = t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t
        return t.astimezone(dt.UTC).replace(microsecond=0).isoformat()
    return dt.datetime.fromtimestamp(int(t), dt.UTC).isoformat()


def parse_iso(value: str | None, name: str) -> dt.datetime | None:
    """A UTC datetime from an ISO 8601 string (UTC when it has no offset); None for None or ""."""
    if value in (None, ""):
        return None
    try:
        t = dt.datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise ValueError(f"{name}={value!r} is not an ISO 8601 date/time") from exc
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)
