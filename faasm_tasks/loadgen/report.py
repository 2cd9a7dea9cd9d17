"""Load driver, reporting: the counters that explain a point, the seed's latency.txt,
the spec as a record."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from .measure import ERROR_KINDS
from .spec import LoadSpec


def load_text() -> str:
    try:
        return "load average {:.1f}, {:.1f}, {:.1f}".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def counters_text(s: dict[str, Any]) -> str:
    e = s.get("errors") or {}
    return (
        f"attempted {s.get('attempted', '?')}, sent {s.get('sent', '?')}, responses {s.get('requests_all', 0)}, "
        f"connect errors {e.get('connect', 0)}, timeouts {e.get('timeout', 0)}, read errors {e.get('read', 0)}, "
        f"non-2xx {e.get('non2xx', 0)}, elapsed {float(s.get('elapsed_s') or 0):.1f} s"
    )


def explain_no_success(s: dict[str, Any]) -> str:
    """One sentence on why a load summary has no successful response, with its counters."""
    counters = f"[{counters_text(s)}; {s.get('host_load', load_text())}]"
    e = s.get("errors") or {}
    last = s.get("last_errors") or {}
    if s.get("ready") is False:
        r = s.get("readiness") or {}
        re_ = r.get("errors") or {}
        got = ", ".join(f"{v} {k}" for k, v in re_.items() if v) or "nothing"
        return (
            f"the target never answered 2xx before the window: {r.get('attempts', 0)} readiness request(s) in "
            f"{r.get('waited_s', 0):g} s (deadline {r.get('ready_timeout_s', 0):g} s) got {got} "
            f"(last: {r.get('last_error') or '-'}); no load was sent {counters}"
        )
    # wrk's summary has no "attempted": what it concluded stands in
    attempted = int(s["attempted"] if "attempted" in s else (s.get("requests_all") or 0) + (s.get("errors_total") or 0))
    window = f"{float(s.get('duration_s') or 0):g} s"
    if attempted == 0:
        if s.get("mode") == "open":
            why = (
                f"{s.get('scheduled', 0)} slot(s) were scheduled and none was sent (the driver fell behind "
                "its schedule)"
            )
        else:
            lag, span = s.get("start_lag_s"), float(s.get("warmup_s") or 0) + float(s.get("duration_s") or 0)
            if lag is None or lag >= span:
                why = (
                    "the driver started after the window had closed"
                    if lag is not None
                    else "the driver never sent a request"
                ) + (f" (start lag {lag:.1f} s)" if lag is not None else "")
            else:
                why = (
                    f"the warm-up's request(s) ({s.get('warmup_attempted', 0)} started, {s.get('warmup_ok', 0)} "
                    "answered 2xx) were still in flight when the window closed"
                )
        return f"zero requests sent in the {window} measurement window: {why} {counters}"
    failed = sum(int(e.get(k, 0)) for k in ERROR_KINDS)
    if e.get("connect", 0) and e.get("connect") == failed and not s.get("requests_all"):
        return (
            f"no connection: all {e['connect']} connect attempt(s) failed (last: {last.get('connect', '-')}) {counters}"
        )
    if e.get("timeout", 0) and e.get("timeout") == failed:
        return (
            f"all {e['timeout']} request(s) timed out (no reply within {float(s.get('timeout_s') or 0):g} s) {counters}"
        )
    if e.get("read", 0) and e.get("read") == failed:
        return f"all {e['read']} request(s) failed reading the reply (last: {last.get('read', '-')}) {counters}"
    if e.get("non2xx", 0) and e.get("non2xx") == failed:
        sts = ", ".join(f"HTTP {k} x{v}" for k, v in sorted((s.get("statuses") or {}).items())) or "statuses unrecorded"
        return f"all {e['non2xx']} repl(ies) were non-2xx ({sts}) {counters}"
    if failed:
        kinds = ", ".join(f"{k}: {last[k]}" for k in ERROR_KINDS if k in last)
        return f"no successful responses: every request failed ({kinds or 'mixed errors'}) {counters}"
    return f"no successful responses: {attempted} request(s) started and none concluded in the window {counters}"


def latency_txt(s: dict[str, Any]) -> str:
    """The seed's ``latency.txt`` lines, plus the error counts it used to drop."""
    if not s.get("latencies_us"):
        lines = ["REQUESTS=0"]
    else:
        lines = [
            f"MIN={s['min_us']}",
            f"MAX={s['max_us']}",
            f"STDDEV={s['stddev_us']:.2f}",
            f"DURATION={int(s.get('measured_duration_s', s['duration_s']) * 1e6)}",
            f"REQUESTS={s['requests_all']}",
            f"MEDIAN={s['p50_us']}",
            f"90TH={s['p90_us']}",
            f"10TH={s['p10_us']}",
            "LATENCIES=" + ",".join(str(v) for v in s["latencies_us"]),
        ]
    lines += [f"ERRORS_{k.upper()}={v}" for k, v in s.get("errors", {}).items()]
    return "\n".join(lines) + "\n"


def spec_dict(spec: LoadSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["body"] = spec.body.decode("utf-8", errors="replace")
    return d
