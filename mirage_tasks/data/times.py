"""The one ISO 8601 time helper of the Mirage steps (stdlib only, so the plan can use it too)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def hours_to_s(hours: float) -> int:
    """Whole seconds of a span given in hours (the flags' unit; stored keys and schedules hold
    seconds): rounded to the nearest second, as every step and key has always done."""
    return int(round(float(hours) * 3600))


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


def window_outside_trace(
    first_submit: Any, last_submit: Any, t_from: Any, t_to: Any, flags: str, trace: str = "the trace"
) -> str | None:
    """Why the window ``[t_from, t_to)`` cannot be replayed from a trace whose submits span
    ``first_submit .. last_submit`` (epoch seconds or datetimes), or None when it can.

    Refused: an empty or reversed window, one that ends at or before the first submit (no job
    of it is in the trace) and one that reaches past the trace's newest UTC day (its jobs are
    not in the trace yet; the newest day itself stays allowed, as ``sample --day`` allows it, so
    a growing trace can be scored up to its last export). The message names ``flags`` and the
    trace's span. Shared by ``calibrate``, ``fidelity`` (and meant for ``waitpred``); stdlib only.
    """

    def _s(t: Any) -> int:
        if isinstance(t, dt.datetime):
            return int((t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t).timestamp())
        if hasattr(t, "timestamp"):  # pandas.Timestamp
            return int(t.timestamp())
        return int(t)

    a, b, first, last = _s(t_from), _s(t_to), _s(first_submit), _s(last_submit)
    span = f"{trace}'s submits span {iso(first)} .. {iso(last)}"
    if b <= a:
        return f"{flags}: the window {iso(a)} .. {iso(b)} is empty (its end must be after its start)"
    newest_day_end = (last // 86400 + 1) * 86400
    if b <= first:
        return f"{flags}: the window {iso(a)} .. {iso(b)} ends before the trace begins ({span})"
    if b > newest_day_end:
        past = (b - last) / 86400
        return (
            f"{flags}: the window {iso(a)} .. {iso(b)} reaches {past:.1f} days past the trace's last submit "
            f"({span}); its jobs are not in the trace: end it by {iso(newest_day_end)}, or ingest a trace "
            f"that covers it"
        )
    return None
