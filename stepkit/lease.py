"""One writer per output prefix: the lease ``_LEASE.json`` under it.

A step takes the lease of its output prefix before it decides whether it can skip and before
its first write, a background thread renews it while the step runs, and the step gives it
back when it has committed, skipped or failed (:meth:`stepkit.step.Step.commit`,
:meth:`~stepkit.step.Step.skip`; the CLI releases whatever a failed step still holds). A second
run writing the same prefix meanwhile (a manual run and a backfill of the same key, a retry
racing its zombie attempt) finds the lease held and fails at once with :class:`LeaseHeld`
(a :class:`~stepkit.errors.StepError`, exit 2) naming the holder; it writes nothing.

The document::

    {"lease": 1, "token": <uuid>, "step": "ingest", "fingerprint": <the run's>, "out": <prefix>,
     "owner": {"host", "pid", "run_id", "started"}, "acquired", "renewed", "expires" (ISO),
     "expires_epoch": <s>, "ttl_s", "heartbeat_s"}

``run_id`` is ``HOUSE_RUN_ID`` when set, else Airflow's ``AIRFLOW_CTX_*`` task context
(dag/run/task/try) when the step runs under a task, else null.

**Every exit path releases.** Commit and skip release; the step CLI releases what a failed
step still holds; and once a process holds a lease, an exit handler releases whatever is still
held at interpreter exit (``sys.exit``, an uncaught exception or ``KeyboardInterrupt``: programs
with their own ``main``, such as ``waitpred``, are covered too) and, where SIGTERM had its
default action, a SIGTERM handler releases and then dies of SIGTERM as before. A forked worker
never releases its parent's lease.

**A dead writer.** A writer that dies without releasing (kill -9, a lost node) leaves its lease.
When the owner ran on this host (same host name, boot id and pid namespace: ``owner.local``)
and its pid no longer runs, or now belongs to a process with another start time (a reused
pid; start time in clock ticks since boot from ``/proc/<pid>/stat``), the next writer takes it
over at once. Otherwise it expires ``HOUSE_LEASE_TTL_S`` seconds (default 90) after its last
renewal; the holder renews every ``HOUSE_LEASE_HEARTBEAT_S`` (default a third of the ttl).
After that the next writer takes it over (logged, naming the dead owner). Expiry is judged by
the taker's wall clock as the earliest of the ``expires_epoch`` the holder wrote, its
``renewed`` time plus its ``ttl_s``, and the object's modification time (the store's clock,
S3's LastModified) plus ``ttl_s``; a lease renewed more than a ttl in the taker's future (a
holder's clock far ahead) counts as expired. Hosts' clocks must agree to well under the ttl
(NTP does). A holder whose renewals fail past its own expiry counts its lease as lost;
before writing its marker a step renews synchronously and checks it still holds the lease
(:meth:`Lease.verify`), so a writer that was paused past its expiry and taken over fails
with exit 2 instead of committing over the new writer's outputs.

**Read-only outputs.** Where the prefix cannot be written (a read-only file system, no
permission, S3 AccessDenied) no lease can be taken (:class:`OutputNotWritable`); a run whose
committed output there is up to date skips all the same (exit 0), any other is refused (exit 2).

**Exclusion, by storage.**

* local (plain path, ``file://``): the document is written to a temporary file and
  hard-linked to ``_LEASE.json``: ``link`` fails when the name exists (an exclusive create that
  never shows a half-written lease; ``O_CREAT|O_EXCL`` where the filesystem has no hard links).
  A takeover renames the expired lease to a unique name (of several takers only one can),
  checks that it moved the very document it judged expired (else it puts it back) and
  creates its own. A renewal checks the token and rewrites the holder's document
  (``os.replace``). Release renames, checks the token and deletes, and removes the folders
  the lease itself created when they are left empty (a run refused on bad input leaves no
  empty output folder behind).
* S3: ``PutObject`` with ``If-None-Match: *`` creates; a takeover and every renewal are
  ``PutObject`` with ``If-Match: <ETag read>`` (a compare-and-swap on the document read), a
  release is ``DeleteObject`` with ``If-Match``. After every create or takeover the document
  is read back and its token compared: a store that ignored the condition and let another
  writer overwrite shows up there, at the next renewal, or at the check before the marker.
  AWS S3 documents both headers on ``PutObject`` and ``If-Match`` on ``DeleteObject``; moto
  (5.2.5, the tests') honours ``If-None-Match: *`` and ``If-Match`` on ``PutObject`` and
  ``DeleteObject`` (``tests/test_lease.py::test_moto_honours_conditional_writes``), but
  its threaded server checks and writes without a lock, so only the read-back protects
  writers that race within the same millisecond there. A store that rejects a conditional
  ``DeleteObject`` gets a plain delete after the token check.
* other fsspec protocols: check, write, read back (no atomic create; logged once).

**Limits.** No storage here offers fencing tokens: a writer frozen between its final check
and its marker write for longer than the ttl could still commit after a takeover. Within
one process, leases are per :class:`Lease` object; two threads of one process must not write
one prefix (the step CLI runs one step per process).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import errno
import json
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from . import storage
from .errors import StepError

LEASE = "_LEASE.json"
TTL_ENV = "HOUSE_LEASE_TTL_S"
HEARTBEAT_ENV = "HOUSE_LEASE_HEARTBEAT_S"
DEFAULT_TTL_S = 90.0
#: The longest ttl a lease may have (a day): a writer renews every heartbeat, so the ttl only
#: says how long a *dead* writer blocks its output. A setting above it is refused, and a lease
#: document that claims more (another host's setting, a corrupt or hand-made document) counts
#: as holding for this long after its last write, so no document can block an output for good.
MAX_TTL_S = 86400.0
log = logging.getLogger("stepkit.lease")


class LeaseHeld(StepError):
    """Another live writer holds the output prefix's lease (exit 2, naming it). ``same_output``:
    it computes the same output (same fingerprint), so a retry once it has finished skips: the
    CLI then exits :data:`EXIT_BUSY` (retryable) instead of 2."""

    def __init__(self, message: str, *, same_output: bool = False):
        super().__init__(message)
        self.same_output = same_output


#: Exit status of a step refused because another run is computing the very same output
#: (sysexits' EX_TEMPFAIL): the house runners retry it, and the retry skips once that run has
#: committed. Two writers of *different* outputs to one prefix exit 2 (no retry can help).
EXIT_BUSY = 75


class OutputNotWritable(StepError):
    """The output prefix cannot be written here (a read-only file system or bucket, no
    permission): no lease can be taken, so no run can write it; a run whose committed output
    is up to date still skips (:meth:`stepkit.step.Step.skip`)."""


class LeaseLost(StepError):
    """This writer's lease expired or was taken over while it ran: it must not commit (exit 2)."""


# ----------------------------------------------------------------------------- settings, owner


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StepError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise StepError(f"{name}={raw!r} must be > 0 seconds")
    return value


def settings(ttl: float | None = None, heartbeat: float | None = None) -> tuple[float, float]:
    """(ttl, heartbeat) in seconds: arguments, else ``HOUSE_LEASE_TTL_S`` / ``HOUSE_LEASE_HEARTBEAT_S``."""
    ttl = float(ttl) if ttl is not None else _seconds(TTL_ENV, DEFAULT_TTL_S)
    if not 0 < ttl <= MAX_TTL_S:
        raise StepError(
            f"{TTL_ENV}={ttl:g} must be above 0 and at most {MAX_TTL_S:g} seconds (a day): it is how "
            "long a writer that died blocks its output"
        )
    heartbeat = float(heartbeat) if heartbeat is not None else _seconds(HEARTBEAT_ENV, ttl / 3)
    if not 0 < heartbeat < ttl:
        raise StepError(
            f"{HEARTBEAT_ENV}={heartbeat:g} must be above 0 and below {TTL_ENV}={ttl:g} "
            "(the lease is renewed several times before it expires)"
        )
    return ttl, heartbeat


def run_id() -> str | None:
    """Who runs this step, for the lease's owner: ``HOUSE_RUN_ID``, else Airflow's task context."""
    if os.environ.get("HOUSE_RUN_ID"):
        return os.environ["HOUSE_RUN_ID"]
    parts = [os.environ.get(f"AIRFLOW_CTX_{k}") for k in ("DAG_ID", "DAG_RUN_ID", "TASK_ID", "TRY_NUMBER")]
    if any(parts):
        return "/".join(p or "?" for p in parts)
    return None


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


def _epoch(iso: Any) -> float | None:
    try:
        t = dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22:
    fixed for the process's life, unlike a wall-clock start derived from it); None when no such
    process runs here or it is a zombie (dead, not yet reaped)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return fields[19]


def _pidns() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def local_identity(pid: int | None = None) -> dict[str, str] | None:
    """What tells a live local process from a dead one whose pid was reused: the boot, the pid
    namespace and the process's start time (Linux ``/proc``); None where there is no ``/proc``."""
    pid = os.getpid() if pid is None else pid
    boot, ns, start = _read("/proc/sys/kernel/random/boot_id"), _pidns(), _proc_start(pid)
    if not (boot and ns and start):
        return None
    return {"boot_id": boot, "pidns": ns, "start_ticks": start}


def writer_gone(doc: dict[str, Any] | None) -> str | None:
    """Why the writer of lease ``doc`` surely no longer runs (same host, boot and pid namespace as
    this process, and its pid gone or now another process's), or None when it may still run
    (another host or container, an older document without the identity, no ``/proc``)."""
    o = (doc or {}).get("owner") or {}
    rec = o.get("local")
    if o.get("host") != socket.gethostname() or not isinstance(rec, dict):
        return None
    mine = local_identity()
    if mine is None or rec.get("boot_id") != mine["boot_id"] or rec.get("pidns") != mine["pidns"]:
        return None
    try:
        pid = int(o.get("pid"))
    except (TypeError, ValueError):
        return None
    if pid <= 0:
        return None
    start = _proc_start(pid)
    if start is None:
        return f"pid {pid} no longer runs on this host"
    if start != str(rec.get("start_ticks")):
        return f"pid {pid} is now another process (started at tick {start}, the writer at {rec.get('start_ticks')})"
    return None


def describe(doc: dict[str, Any] | None) -> str:
    """The owner of a lease document, in words (for error messages and logs)."""
    if not doc:
        return "an unreadable lease (no owner recorded)"
    o = doc.get("owner") or {}
    run = f", run {o['run_id']}" if o.get("run_id") else ""
    step = f"{doc['step']} " if doc.get("step") else ""
    return (
        f"{step}on host {o.get('host', '?')} pid {o.get('pid', '?')}{run}, started {o.get('started', '?')}, "
        f"lease renewed {doc.get('renewed', '?')}, expires {doc.get('expires', '?')}"
    )


def _finite(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _positive(v: Any) -> float | None:
    x = _finite(v)
    return x if x is not None and x > 0 else None


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) and "token" in doc else None


# ----------------------------------------------------------------------------- storage back ends


@dataclass(frozen=True)
class Seen:
    """One read of the lease object: its bytes, a version tag (S3 ETag) and modification time."""

    raw: bytes
    tag: str | None
    modified: float

    @property
    def doc(self) -> dict[str, Any] | None:
        return _parse(self.raw)

    @property
    def token(self) -> str | None:
        doc = self.doc
        return doc.get("token") if doc else None


class _Local:
    """``_LEASE.json`` in a local folder (see the module docstring)."""

    def __init__(self, out: str):
        self.dir = storage.normalize(out)
        self.path = os.path.join(self.dir, LEASE)
        self.made: str | None = None  # the topmost folder this lease created

    def _side(self, kind: str) -> str:
        return os.path.join(self.dir, f".{LEASE}.{kind}-{uuid.uuid4().hex[:12]}")

    def read(self) -> Seen | None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
                modified = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        return Seen(raw, None, modified)

    def _ensure_dir(self) -> None:
        if os.path.isdir(self.dir):
            return
        top = self.dir
        while not os.path.exists(os.path.dirname(top)) and os.path.dirname(top) != top:
            top = os.path.dirname(top)
        os.makedirs(self.dir, exist_ok=True)
        if self.made is None:
            self.made = top

    def _write(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def create(self, data: bytes) -> bool:
        for _ in range(5):
            self._ensure_dir()
            tmp = self._side("tmp")
            try:
                self._write(tmp, data)
            except FileNotFoundError:  # a releasing writer removed the empty folder meanwhile
                continue
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                return self._create_excl(data)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        raise OSError(f"could not create {self.path}: its folder keeps disappearing")

    def _create_excl(self, data: bytes) -> bool:
        """Exclusive create where hard links are not supported (a reader may see it half-written;
        :class:`Lease` treats an unparsable lease as held until its file is a ttl old)."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    def _rename_away(self, seen: Seen) -> str | None:
        """Move the lease to a unique name if it is still ``seen``; the new name, or None.
        Only one of several concurrent callers can move it; a changed lease is put back."""
        side = self._side("stale")
        try:
            os.rename(self.path, side)
        except FileNotFoundError:
            return None
        with open(side, "rb") as f:
            moved = f.read()
        if moved != seen.raw:  # renewed or replaced since it was read: not ours to take
            with contextlib.suppress(FileExistsError):
                os.link(side, self.path)
            os.unlink(side)
            return None
        return side

    def swap(self, data: bytes, seen: Seen) -> bool:
        """Replace the lease ``seen`` (expired) by ``data``; False when another writer was first."""
        side = self._rename_away(seen)
        if side is None:
            return False
        try:
            return self.create(data)
        finally:
            os.unlink(side)

    def renew(self, data: bytes, seen: Seen) -> Seen | None:
        tmp = self._side("tmp")
        try:
            self._write(tmp, data)
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return Seen(data, None, time.time())

    def delete(self, seen: Seen) -> bool:
        side = self._rename_away(seen)
        if side is None:
            return False
        os.unlink(side)
        return True

    def cleanup(self) -> None:
        """Remove the folders this lease created, when they are empty (nothing was written)."""
        if self.made is None:
            return
        path = self.dir
        while True:
            try:
                os.rmdir(path)
            except OSError:
                return
            if path == self.made or os.path.dirname(path) == path:
                return
            path = os.path.dirname(path)


_S3_CLIENTS: dict[str | None, Any] = {}
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404"}


def _s3_client() -> Any:
    """A botocore S3 client with the storage's endpoint (``AWS_ENDPOINT_URL(_S3)``) and settings."""
    import botocore.session  # only S3 outputs pay for botocore
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    if endpoint not in _S3_CLIENTS:
        config = Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"})
        _S3_CLIENTS[endpoint] = botocore.session.get_session().create_client("s3", endpoint_url=endpoint, config=config)
    return _S3_CLIENTS[endpoint]


def _code(exc: Exception) -> tuple[str, int | None]:
    resp = getattr(exc, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", "")), resp.get("ResponseMetadata", {}).get("HTTPStatusCode")


class _S3:
    """``_LEASE.json`` as an S3 object, written with conditional requests (module docstring)."""

    def __init__(self, out: str):
        uri = storage.join(out, LEASE)
        bucket, _, key = uri.split("://", 1)[1].partition("/")
        self.bucket, self.key = bucket, key
        self.client = _s3_client()

    def _conflict(self, exc: Exception) -> bool:
        code, status = _code(exc)
        return code in _CONFLICT_CODES or status in (409, 412, 404)

    def read(self) -> Seen | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            code, status = _code(exc)
            if code in ("NoSuchKey", "404") or status == 404:
                return None
            raise
        return Seen(r["Body"].read(), r["ETag"], r["LastModified"].timestamp())

    def _put(self, data: bytes, **cond: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.put_object(
                Bucket=self.bucket, Key=self.key, Body=data, ContentType="application/json", **cond
            )
        except ClientError as exc:
            if self._conflict(exc):
                return None
            code, status = _code(exc)
            if code == "AccessDenied" or status == 403:
                raise OutputNotWritable(
                    f"output s3://{self.bucket}/{self.key.rsplit('/', 1)[0]}: cannot write "
                    f"there: {code or status} on PutObject"
                ) from None
            raise
        return r.get("ETag", "")

    def create(self, data: bytes) -> bool:
        return self._put(data, IfNoneMatch="*") is not None

    def swap(self, data: bytes, seen: Seen) -> bool:
        return self._put(data, IfMatch=seen.tag or "") is not None

    def renew(self, data: bytes, seen: Seen) -> Seen | None:
        etag = self._put(data, IfMatch=seen.tag or "")
        return None if etag is None else Seen(data, etag, time.time())

    def delete(self, seen: Seen) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=seen.tag or "")
        except ClientError as exc:
            if self._conflict(exc):
                return False
            code, status = _code(exc)
            if code not in ("NotImplemented", "InvalidArgument", "InvalidRequest") and status != 501:
                raise
            # a store without conditional deletes: the token was checked just before
            self.client.delete_object(Bucket=self.bucket, Key=self.key)
        return True

    def cleanup(self) -> None:
        pass


class _Generic:
    """Any other fsspec store: check, write, read back (no atomic create)."""

    warned = False

    def __init__(self, out: str):
        self.uri = storage.join(out, LEASE)
        if not _Generic.warned:
            log.warning(
                "%s: this store has no exclusive create; the lease is check-then-write with read-back", self.uri
            )
            _Generic.warned = True

    def read(self) -> Seen | None:
        if not storage.exists(self.uri):
            return None
        try:
            raw = storage.read_bytes(self.uri)
        except FileNotFoundError:
            return None
        return Seen(raw, None, time.time())

    def create(self, data: bytes) -> bool:
        if storage.exists(self.uri):
            return False
        storage.write_bytes(self.uri, data)
        return True

    def swap(self, data: bytes, seen: Seen) -> bool:
        now = self.read()
        if now is None or now.raw != seen.raw:
            return False
        storage.write_bytes(self.uri, data)
        return True

    def renew(self, data: bytes, seen: Seen) -> Seen | None:
        storage.write_bytes(self.uri, data)
        return Seen(data, None, time.time())

    def delete(self, seen: Seen) -> bool:
        storage.remove(self.uri)
        return True

    def cleanup(self) -> None:
        pass


def _store(out: str):
    if storage.is_local(out):
        return _Local(out)
    if out.startswith(("s3://", "s3a://")):
        return _S3(out)
    return _Generic(out)


# ----------------------------------------------------------------------------- the heartbeat


def block_stop_signals() -> None:
    """Block SIGTERM and SIGINT in the calling (background) thread, so that they reach the main
    thread, whose handlers (a lease's release, :func:`stepkit.procs.trap_sigterm`) run only there.
    Not for a thread that starts processes: a child inherits the mask across exec."""
    if threading.current_thread() is threading.main_thread():
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no pthread_sigmask: nothing to do
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


class _Keeper:
    """One daemon thread per process renewing every held lease when its heartbeat is due."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.leases: list[Lease] = []
        self.thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self.cond:
            self.leases.append(lease)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="stepkit-lease-heartbeat", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def remove(self, lease: Lease) -> None:
        with self.cond:
            if lease in self.leases:
                self.leases.remove(lease)
            self.cond.notify_all()

    def _run(self) -> None:
        # SIGTERM and SIGINT for the main thread only: the kernel hands a process-directed signal to
        # any thread that does not block it, and one taken by this thread leaves a main thread
        # blocked in a long system call (a sleep, a wait on a child) unaware until that call
        # returns: the lease stays held and the step runs on. This thread starts no process, so
        # no child inherits the mask.
        block_stop_signals()
        while True:
            with self.cond:
                while True:
                    if not self.leases:
                        self.cond.wait()
                        continue
                    now = time.monotonic()
                    due = [x for x in self.leases if x.next_beat <= now]
                    if due:
                        break
                    self.cond.wait(min(x.next_beat for x in self.leases) - now)
            for lease in due:
                try:
                    lease.beat()
                except Exception:  # never let the heartbeat thread die
                    log.exception("%s: lease heartbeat failed", lease.uri)


_keeper = _Keeper()
_held: set[Lease] = set()  # the leases this process holds (released by release_all)
_held_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it


# ----------------------------------------------------------------------------- the lease


class Lease:
    """The lease on ``out`` for one run of step ``step`` (see the module docstring)."""

    def __init__(
        self,
        out: str,
        step: str = "",
        *,
        fingerprint: str | None = None,
        started: str | None = None,
        ttl: float | None = None,
        heartbeat: float | None = None,
    ):
        self.out = storage.normalize(out)
        self.uri = storage.join(self.out, LEASE)
        self.step = step
        self.fingerprint = fingerprint
        self.ttl, self.heartbeat = settings(ttl, heartbeat)
        self.token = uuid.uuid4().hex
        self.owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": run_id(),
            "started": started or _iso(time.time()),
        }
        ident = local_identity()
        if ident is not None:
            self.owner["local"] = ident
        self.acquired: str | None = None
        self.took_over: dict[str, Any] | None = None  # the expired lease this one replaced
        self.held = False
        self.lost: str | None = None
        self.expires = 0.0
        self.next_beat = float("inf")
        self._seen: Seen | None = None
        self._lock = threading.RLock()
        self._store = _store(self.out)

    def __repr__(self) -> str:
        return f"Lease({self.uri!r}, held={self.held}, lost={self.lost!r})"

    def _document(self, now: float) -> bytes:
        self.acquired = self.acquired or _iso(now)
        doc = {
            "lease": 1,
            "token": self.token,
            "step": self.step,
            "fingerprint": self.fingerprint,
            "out": self.out,
            "owner": self.owner,
            "acquired": self.acquired,
            "renewed": _iso(now),
            "expires": _iso(now + self.ttl),
            "expires_epoch": round(now + self.ttl, 3),
            "ttl_s": self.ttl,
            "heartbeat_s": self.heartbeat,
        }
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def _expiry(self, seen: Seen) -> float:
        """When the lease ``seen`` expires, by this reader's clock: the earliest of the
        ``expires_epoch`` its holder wrote, its ``renewed`` time plus its ``ttl_s`` and the
        object's modification time (the store's clock: S3's LastModified) plus ``ttl_s``, so a
        holder whose clock or document says "far in the future" holds it one ttl past its last
        write at most. A lease renewed more than a ttl in this reader's future (a clock ahead by
        more than the lease's contract allows) counts as expired: were its writer alive, its
        next renewal finds the takeover and it stops without committing (:class:`LeaseLost`)."""
        doc = seen.doc
        if not doc:
            return seen.modified + self.ttl
        ttl = min(_positive(doc.get("ttl_s")) or self.ttl, MAX_TTL_S)
        times = [seen.modified + ttl]
        expires = _finite(doc.get("expires_epoch"))
        if expires is not None:
            times.append(expires)
        renewed = _epoch(doc.get("renewed"))
        if renewed is not None:
            if renewed > time.time() + ttl:
                return 0.0  # long past
            times.append(renewed + ttl)
        return min(times)

    def _held_error(self, seen: Seen) -> LeaseHeld:
        doc = seen.doc or {}
        # the expiry this reader judges (:meth:`_expiry`), not the one the document claims: the
        # message must say when this output is free, and the two differ for a document whose
        # ttl or clock this reader does not believe
        until = self._expiry(seen)
        claimed = doc.get("expires")
        when = (
            f" It is free in {max(0.0, until - time.time()):.0f} s"
            + (
                f" (its document claims it expires {claimed}; this host counts {_iso(until)}: the earliest of its "
                f"expires_epoch, its renewal and its file's time plus its ttl, at most {MAX_TTL_S:g} s)"
                if claimed and claimed != _iso(until)
                else ""
            )
            + "."
        )
        owner = describe({**doc, "expires": _iso(until)} if doc else None)
        same_output = bool(self.fingerprint and doc.get("fingerprint") == self.fingerprint)
        same = (
            " It computes the same output (same fingerprint): a rerun after it has finished skips."
            if same_output
            else ""
        )
        return LeaseHeld(
            f"{self.out} is being written by another run: {owner} ({self.uri}). Two writers of "
            f"one output prefix would leave a mix of both, so this run writes nothing; rerun it when that run "
            f"has finished (a writer that died keeps the lease until it expires, {TTL_ENV} after its last "
            f"renewal).{when}{same}",
            same_output=same_output,
        )

    def acquire(self) -> Lease:
        """Take the lease, or raise :class:`LeaseHeld` naming its live holder (a
        :class:`StepError` naming the output when its folder cannot be made: a file in the
        way, no permission). Ended by any exception (SIGINT's KeyboardInterrupt or SIGTERM's stop
        arriving between the document's creation and its read-back included), it leaves no lease
        of this writer behind (:meth:`_abandon`)."""
        try:
            return self._acquire_mapped()
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Hold nothing and leave nothing after an acquisition that did not return: this writer's
        document, if it reached the store, is deleted (another writer's is left alone)."""
        if self.held:
            self.release()
            return
        self._delete_own("could not remove an unfinished lease (%s); it expires by itself")

    def _delete_own(self, failed: str) -> None:
        """Delete the store's lease if it is this writer's, then the side files; a failure is logged
        (``failed`` % the error): the caller's outcome stands, and the lease expires by itself."""
        try:
            seen = self._store.read()
            if seen is not None and seen.token == self.token:
                self._store.delete(seen)
            self._store.cleanup()
        except Exception as exc:  # noqa: BLE001 - the caller's outcome is settled; the lease expires
            log.warning("%s: " + failed, self.out, exc)

    def _acquire_mapped(self) -> Lease:
        try:
            return self._acquire()
        except OutputNotWritable:
            raise
        except (NotADirectoryError, FileExistsError, IsADirectoryError) as exc:
            raise StepError(
                f"output {self.out}: cannot create or use it as a folder: "
                f"{exc.strerror or exc} ({exc.filename or self.out})"
            ) from None
        except OSError as exc:
            if not isinstance(exc, PermissionError) and exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise OutputNotWritable(
                f"output {self.out}: cannot write there: {exc.strerror or exc} ({exc.filename or self.out})"
            ) from None

    def _acquire(self) -> Lease:
        last: Seen | None = None
        for _ in range(8):
            seen = self._store.read()
            now = time.time()
            if seen is None:
                data = self._document(now)
                if self._store.create(data) and self._confirm(now):
                    return self
                continue  # another writer created it first: read whose it is
            last = seen
            if seen.token == self.token:  # our own document (a read-back that lagged)
                if self._confirm(now):
                    return self
                continue
            gone = writer_gone(seen.doc)
            if gone is None and now < self._expiry(seen):
                raise self._held_error(seen)
            if self._store.swap(self._document(now), seen) and self._confirm(now):
                self.took_over = seen.doc or {}
                if gone is not None:
                    log.warning(
                        "%s: took over the lease of a writer that is gone (%s): %s", self.out, gone, describe(seen.doc)
                    )
                else:
                    log.warning("%s: took over the expired lease of %s", self.out, describe(seen.doc))
                return self
        raise (
            self._held_error(last)
            if last is not None
            else LeaseHeld(
                f"{self.out}: could not take its lease {self.uri} (it kept changing); another writer is active"
            )
        )

    def _confirm(self, now: float) -> bool:
        """Read the lease back: True (and held from now) when it carries this writer's token."""
        seen = self._store.read()
        if seen is None or seen.token != self.token:
            return False
        with self._lock:
            self._seen = seen
            self.held, self.lost = True, None
            self.expires = now + self.ttl
            self.next_beat = time.monotonic() + self.heartbeat
        with _held_lock:
            _held.add(self)
        _guard_exits()
        _keeper.add(self)
        return True

    def _lose(self, why: str) -> None:
        self.lost = why
        self.next_beat = float("inf")
        _keeper.remove(self)
        log.error("%s: lease lost: %s", self.out, why)

    def beat(self) -> bool:
        """Renew now (the heartbeat calls this); False when the lease is lost."""
        with self._lock:
            if not self.held or self.lost:
                return False
            now = time.time()
            try:
                seen = self._store.read()
                if seen is None or seen.token != self.token:
                    self._lose(
                        f"{self.uri} now belongs to {describe(seen.doc)}"
                        if seen is not None
                        else f"{self.uri} was removed by another writer"
                    )
                    return False
                new = self._store.renew(self._document(now), seen)
                if new is None:
                    self._lose(f"{self.uri} changed while it was being renewed")
                    return False
            except Exception as exc:  # noqa: BLE001 - storage trouble: retry until our own expiry
                if time.time() >= self.expires:
                    self._lose(f"could not renew {self.uri} before it expired ({exc})")
                    return False
                log.warning("%s: could not renew the lease (%s); retrying", self.out, exc)
                self.next_beat = time.monotonic() + min(self.heartbeat, max(1.0, (self.expires - now) / 4))
                return True
            self._seen = new
            self.expires = now + self.ttl
            self.next_beat = time.monotonic() + self.heartbeat
            return True

    def check(self) -> None:
        """Raise :class:`LeaseLost` when the heartbeat found the lease lost (no storage access)."""
        if self.lost:
            raise LeaseLost(f"{self.out}: this run lost its lease and stops writing: {self.lost}")
        if not self.held:
            raise LeaseLost(f"{self.out}: this run does not hold its lease {self.uri}")

    def verify(self) -> None:
        """Renew synchronously and check the lease is still this writer's (before a commit)."""
        self.check()
        self.beat()
        self.check()

    def release(self) -> None:
        """Give the lease back (idempotent); a lost lease is left to its new owner. A forked child
        (a worker process) never releases its parent's lease."""
        if os.getpid() != self.owner["pid"]:
            return
        with self._lock:
            if not self.held:
                return
            self.held = False
            self.next_beat = float("inf")
        _keeper.remove(self)
        with _held_lock:
            _held.discard(self)
        if self.lost:
            return
        self._delete_own(f"could not release the lease (%s); it expires at {_iso(self.expires)}")


def release_all() -> None:
    """Release every lease this process still holds (the CLI calls this when a step ends)."""
    with _held_lock:
        leases = list(_held)
    for lease in leases:
        lease.release()


# ----------------------------------------------------------------------------- every exit path

_guarded = False


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM while leases are held (installed only where SIGTERM had its default action):
    release them, then die of SIGTERM as before (the exit status callers see is unchanged)."""
    try:
        release_all()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _guard_exits() -> None:
    """Release held leases on every way out of the process, also for a program that takes leases
    outside the step CLI (its ``finally`` releases too): at interpreter exit (``sys.exit``, an
    uncaught exception or ``KeyboardInterrupt``) and on SIGTERM when nothing else handles it (a
    handler installed later, e.g. :func:`stepkit.pool.stop_on_sigterm`, raises instead, and the
    exit releases then). A process killed by SIGKILL leaves its lease: the next writer on this host
    takes it over at once (:func:`writer_gone`), elsewhere when it expires."""
    global _guarded
    if _guarded:
        return
    _guarded = True
    atexit.register(release_all)
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _on_sigterm)
