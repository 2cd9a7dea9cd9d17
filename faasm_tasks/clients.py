"""Clients for the upload API and both invocation protocols, each call with a deadline.

* 2020 Knative protocol: JSON POST to the ingress with a ``Host`` header per service,
  ``"async": true`` returns a message id, then ``{"status": true, "id": N}`` polls
  (always with the worker Host) until ``SUCCESS: ...`` or ``FAILED: ...``.
* planner protocol (Faasm >= 0.10): ``{"http_type": "EXECUTE_BATCH", "payload": "<json>"}``
  with base64 ``input_data``, then ``EXECUTE_BATCH_STATUS`` polls.

A call never polls forever: it ends at its deadline, a ``FAILED`` status ends it at
once, and so does ``check`` (a liveness probe of the target, called at every poll) when
it reports a problem such as a dead worker. Every result keeps the raw exchanges (bodies truncated to 64 KiB), so a
failure can be diagnosed from the stored record.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import requests

from .targets.base import Endpoints

RAW_LIMIT = 64 * 1024


class UploadError(Exception):
    pass


def _trunc(body: bytes | str | None) -> str:
    if body is None:
        return ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    return body if len(body) <= RAW_LIMIT else body[:RAW_LIMIT] + f"...[{len(body) - RAW_LIMIT} more chars]"


@dataclass
class CallResult:
    ok: bool
    status: str  # success | failed | timeout | error
    output: str = ""
    call_id: Any = None
    elapsed_s: float = 0.0
    error: str | None = None
    raw: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class UploadClient:
    """``PUT /f/<user>/<func>``, ``/p/...``, ``PUT``/``GET /s/<user>/<key>``, ``PUT /file``."""

    def __init__(self, base_url: str, timeout_s: float = 300.0, session: requests.Session | None = None):
        self.base = base_url.rstrip("/")
        self.timeout = timeout_s
        self.s = session or requests.Session()

    def _put(self, path: str, data: bytes, headers: dict[str, str] | None = None) -> str:
        try:
            r = self.s.put(self.base + path, data=data, headers=headers or {}, timeout=self.timeout)
        except requests.RequestException as exc:
            raise UploadError(f"PUT {path}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise UploadError(f"PUT {path}: HTTP {r.status_code}: {_trunc(r.content)}")
        return r.text

    def put_function(self, user: str, func: str, wasm: bytes) -> str:
        return self._put(f"/f/{user}/{func}", wasm)

    def put_python(self, user: str, func: str, source: bytes) -> str:
        return self._put(f"/p/{user}/{func}", source)

    def put_state(self, user: str, key: str, data: bytes) -> str:
        return self._put(f"/s/{user}/{key}", data)

    def put_file(self, path: str, data: bytes) -> str:
        return self._put("/file", data, {"FilePath": path})

    def get_state(self, user: str, key: str) -> bytes | None:
        try:
            r = self.s.get(f"{self.base}/s/{user}/{key}", timeout=self.timeout)
        except requests.RequestException as exc:
            raise UploadError(f"GET /s/{user}/{key}: {type(exc).__name__}: {exc}") from exc
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise UploadError(f"GET /s/{user}/{key}: HTTP {r.status_code}: {_trunc(r.content)}")
        return r.content or None  # the 2020 server answers an empty body for a missing key

    def ping(self) -> bool:
        try:
            return self.s.get(self.base + "/ping", timeout=min(self.timeout, 5)).ok
        except requests.RequestException:
            return False


def service_name(system: str, user: str, function: str, python: bool = False) -> str:
    """The Knative service that receives a call: the Faasm worker, or the native function."""
    if system == "wasm":
        return "worker"
    return "python" if python else function


class Invoker:
    """Common interface. ``call`` submits asynchronously and waits for the outcome."""

    def __init__(self, endpoints: Endpoints, session: requests.Session | None = None, request_timeout_s: float = 30.0):
        self.ep = endpoints
        self.s = session or requests.Session()
        self.request_timeout = request_timeout_s

    def _log(self, res: CallResult, what: str, resp: requests.Response | None = None, note: str = "") -> None:
        entry: dict[str, Any] = {"t": round(time.time(), 3), "what": what}
        if resp is not None:
            entry.update(http_status=resp.status_code, body=_trunc(resp.content))
        if note:
            entry["note"] = note
        res.raw.append(entry)
        if len(res.raw) > 200:  # keep the first exchanges and the latest ones
            del res.raw[100]

    def _post(self, res: CallResult, what: str, deadline: float, **kw) -> requests.Response | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            r = self.s.post(self.ep.invoke_url, timeout=min(self.request_timeout, left), **kw)
        except requests.Timeout as exc:
            self._log(res, what, note=f"timeout: {exc}")
            return None
        except requests.RequestException as exc:
            self._log(res, what, note=f"{type(exc).__name__}: {exc}")
            res.error = f"{what}: {type(exc).__name__}: {exc}"
            return None
        self._log(res, what, r)
        return r

    def call(
        self,
        user: str,
        function: str,
        input_data: str = "",
        *,
        system: str = "native",
        python: bool = False,
        py_user: str | None = None,
        py_func: str | None = None,
        timeout_s: float = 600.0,
        poll_interval_s: float = 1.0,
        extra: dict[str, Any] | None = None,
        check: Callable[[], str | None] | None = None,
    ) -> CallResult:
        raise NotImplementedError

    @staticmethod
    def _unhealthy(res: CallResult, check: Callable[[], str | None] | None) -> bool:
        """Run the liveness probe; on a problem the call ends as failed, naming it."""
        problem = check() if check else None
        if problem:
            res.status, res.error = "failed", f"call {res.call_id} abandoned: {problem}"
            res.raw.append({"t": round(time.time(), 3), "what": "liveness", "note": problem})
        return bool(problem)


class KnativeInvoker(Invoker):
    protocol = "knative"

    def message(self, user, function, input_data, python, py_user, py_func, extra) -> dict[str, Any]:
        if python:
            msg = {
                "user": "python",
                "function": "py_func",
                "python": True,
                "py_user": py_user or user,
                "py_func": py_func or function,
            }
        else:
            msg = {"user": user, "function": function}
        if input_data:
            msg["input_data"] = input_data  # 2020: a plain string, not base64
        msg.update(extra or {})
        return msg

    def call(
        self,
        user,
        function,
        input_data="",
        *,
        system="native",
        python=False,
        py_user=None,
        py_func=None,
        timeout_s=600.0,
        poll_interval_s=1.0,
        extra=None,
        check=None,
    ) -> CallResult:
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        res = CallResult(ok=False, status="error")
        msg = self.message(user, function, input_data, python, py_user, py_func, extra)
        msg["async"] = True
        host = self.ep.host_for(service_name(system, user, function, python))
        r = self._post(res, "invoke", deadline, json=msg, headers={"Host": host})
        if r is None or r.status_code != 200:
            res.status = "timeout" if r is None and res.error is None else "error"
            res.error = res.error or (f"invoke HTTP {r.status_code}" if r is not None else "invoke timed out")
            res.elapsed_s = time.monotonic() - t0
            return res
        try:
            res.call_id = int(r.text.strip())
        except ValueError:
            res.error = f"invoke returned no message id: {_trunc(r.text)[:200]!r}"
            res.elapsed_s = time.monotonic() - t0
            return res
        worker_host = self.ep.host_for("worker")
        while True:
            now = time.monotonic()
            if now >= deadline:
                res.status, res.error = "timeout", f"no final status after {timeout_s}s"
                break
            time.sleep(min(poll_interval_s, max(0.0, deadline - now)))
            if self._unhealthy(res, check):
                break
            r = self._post(
                res, "status", deadline, json={"status": True, "id": res.call_id}, headers={"Host": worker_host}
            )
            if r is None:
                continue
            text = r.text
            if r.status_code == 200 and text.startswith("SUCCESS"):
                res.ok, res.status, res.output = True, "success", text  # keep the full payload
                break
            if text.startswith("FAILED") or r.status_code >= 400:
                res.status, res.output = "failed", text
                res.error = f"call {res.call_id} failed: HTTP {r.status_code}: {_trunc(text)[:500]}"
                break
            # RUNNING (or anything else): keep polling until the deadline
            if len(res.raw) > 3 and res.raw[-2].get("body") == res.raw[-1].get("body"):
                res.raw.pop(-2)  # collapse identical RUNNING polls
        res.elapsed_s = time.monotonic() - t0
        return res

    def call_sync(self, msg: dict[str, Any], host: str, timeout_s: float) -> CallResult:
        t0 = time.monotonic()
        res = CallResult(ok=False, status="error")
        r = self._post(res, "invoke-sync", t0 + timeout_s, json=msg, headers={"Host": host})
        res.elapsed_s = time.monotonic() - t0
        if r is None:
            res.status = "timeout" if res.error is None else "error"
            res.error = res.error or f"no response within {timeout_s}s"
        elif r.status_code == 200:
            res.ok, res.status, res.output = True, "success", r.text
        else:
            res.status, res.output, res.error = "failed", r.text, f"HTTP {r.status_code}"
        return res

    def flush(self, timeout_s: float = 30.0) -> CallResult:
        return self.call_sync({"flush": True}, self.ep.host_for("worker"), timeout_s)


class PlannerInvoker(Invoker):
    protocol = "planner"
    NOT_READY = "App not registered in results"
    NO_HOSTS = "No available hosts"

    def _http(self, res, what, deadline, http_type: str, payload: dict[str, Any]):
        return self._post(res, what, deadline, json={"http_type": http_type, "payload": json.dumps(payload)})

    def call(
        self,
        user,
        function,
        input_data="",
        *,
        system="wasm",
        python=False,
        py_user=None,
        py_func=None,
        timeout_s=600.0,
        poll_interval_s=2.0,
        extra=None,
        check=None,
    ) -> CallResult:
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        res = CallResult(ok=False, status="error")
        m: dict[str, Any] = {"user": user, "function": function}
        if input_data:
            m["input_data"] = base64.b64encode(input_data.encode()).decode()
        if python:
            m.update(python=True, py_user=py_user or user, py_func=py_func or function)
        m.update(extra or {})
        ber = {"user": user, "function": function, "messages": [m]}
        while True:  # submit; "No available hosts" is retried until the deadline
            r = self._http(res, "EXECUTE_BATCH", deadline, "EXECUTE_BATCH", ber)
            if r is not None and r.status_code == 200:
                break
            if r is not None and not (r.status_code == 500 and self.NO_HOSTS in r.text):
                res.status, res.output, res.error = "failed", r.text, f"EXECUTE_BATCH HTTP {r.status_code}"
                res.elapsed_s = time.monotonic() - t0
                return res
            if time.monotonic() + 1.5 >= deadline:
                res.status, res.error = "timeout", res.error or "EXECUTE_BATCH not accepted before the deadline"
                res.elapsed_s = time.monotonic() - t0
                return res
            time.sleep(1.5)
        try:
            status = r.json()
            res.call_id = status["appId"]
        except (ValueError, KeyError) as exc:
            res.error = f"EXECUTE_BATCH reply without appId: {exc}"
            res.elapsed_s = time.monotonic() - t0
            return res
        expected = len(ber["messages"])
        while True:
            now = time.monotonic()
            if now >= deadline:
                res.status, res.error = "timeout", f"batch {res.call_id} not finished after {timeout_s}s"
                break
            time.sleep(min(poll_interval_s, max(0.0, deadline - now)))
            if self._unhealthy(res, check):
                break
            r = self._http(
                res,
                "EXECUTE_BATCH_STATUS",
                deadline,
                "EXECUTE_BATCH_STATUS",
                {"appId": res.call_id, "expectedNumMessages": expected},
            )
            if r is None or (r.status_code == 500 and self.NOT_READY in r.text):
                continue
            if r.status_code != 200:
                res.status, res.output, res.error = "failed", r.text, f"EXECUTE_BATCH_STATUS HTTP {r.status_code}"
                break
            try:
                st = r.json()
            except ValueError:
                res.status, res.error = "failed", "EXECUTE_BATCH_STATUS returned non-JSON"
                break
            if not st.get("finished"):
                continue
            outs, failed = [], False
            for mr in st.get("messageResults", []):
                data = mr.get("output_data", mr.get("outputData", ""))
                try:
                    text = base64.b64decode(data).decode("utf-8", errors="replace") if data else ""
                except ValueError:
                    text = str(data)
                outs.append(text)
                failed |= int(mr.get("returnValue", 0) or 0) != 0
            res.output = "\n".join(outs)
            res.ok, res.status = (not failed), ("failed" if failed else "success")
            if failed:
                res.error = f"batch {res.call_id}: a message returned non-zero"
            break
        res.elapsed_s = time.monotonic() - t0
        return res


def make_invoker(endpoints: Endpoints, protocol: str | None = None, **kw) -> Invoker:
    proto = protocol or endpoints.protocol
    if proto == "knative":
        return KnativeInvoker(endpoints, **kw)
    if proto == "planner":
        return PlannerInvoker(endpoints, **kw)
    raise ValueError(f"unknown protocol {proto!r} (knative or planner)")
