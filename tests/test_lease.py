"""``stepkit.lease`` (one writer per output prefix) and ``stepkit.step.verify_read`` (inputs
checked against their upstream marker), locally and on S3 (a moto server).

The concurrent runs of real steps (``ingest``, ``merge``) and a writer killed with SIGKILL
are in ``tests/mirage/test_one_writer_e2e.py``. No test here waits for a time to pass: an
expired lease is written as one (``expires_epoch`` in the past), a heartbeat is awaited as
a condition with a generous deadline.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from moto_s3 import list_keys, moto_s3, s3_client, storage_env
from proctree import wait_for

from stepkit import MARKER, Step, StepError, lease as leases, read_marker, require_committed, storage
from stepkit.lease import LEASE, Lease, LeaseHeld, LeaseLost

pytestmark = pytest.mark.timeout(180)

BUCKET = "house-lease"


def dead_writer_lease(pid: int = 999_999, expired: bool = True) -> bytes:
    """The document a writer that died leaves behind (expired, or not yet)."""
    now = time.time()
    expires = now - 5 if expired else now + 3600
    doc = {
        "lease": 1,
        "token": "dead-writer-token",
        "step": "demo",
        "out": "?",
        "owner": {"host": "other-host", "pid": pid, "run_id": "manual__x", "started": "2026-01-01T00:00:00+00:00"},
        "acquired": "2026-01-01T00:00:00+00:00",
        "renewed": leases._iso(expires - 3600),
        "expires": leases._iso(expires),
        "expires_epoch": expires,
        "ttl_s": 3600,
        "heartbeat_s": 1200,
    }
    return json.dumps(doc).encode()


# ----------------------------------------------------------------------------- where: local folder or S3


@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_s3(BUCKET) as url:
        yield url


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path, monkeypatch):
    """An output prefix URI (a fresh one per test) and a function reading its lease object's bytes."""
    if request.param == "local":
        out = str(tmp_path / "out")

        def raw():
            path = os.path.join(out, LEASE)
            return open(path, "rb").read() if os.path.exists(path) else None

        def put(data: bytes):
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, LEASE), "wb") as f:
                f.write(data)

        return out, raw, put
    url = request.getfixturevalue("s3_endpoint")
    for k, v in storage_env(url).items():
        monkeypatch.setenv(k, v)
    key = f"runs/{tmp_path.name}/out"
    client = s3_client(url)

    def raw():
        try:
            return client.get_object(Bucket=BUCKET, Key=f"{key}/{LEASE}")["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    def put(data: bytes):
        client.put_object(Bucket=BUCKET, Key=f"{key}/{LEASE}", Body=data)

    return f"s3://{BUCKET}/{key}", raw, put


def test_second_writer_is_refused_naming_the_owner(where):
    out, raw, _ = where
    first = Lease(out, "demo", ttl=3600).acquire()
    try:
        doc = json.loads(raw())
        assert doc["token"] == first.token and doc["owner"]["pid"] == os.getpid()
        with pytest.raises(LeaseHeld) as exc:
            Lease(out, "demo").acquire()
        msg = str(exc.value)
        assert f"host {socket.gethostname()} pid {os.getpid()}" in msg and "being written by another run" in msg
        assert raw() is not None and json.loads(raw())["token"] == first.token  # the refused one changed nothing
    finally:
        first.release()
    assert raw() is None
    second = Lease(out, "demo").acquire()  # free again
    second.release()


def test_released_lease_leaves_no_empty_folder(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    Lease(str(out), "demo").acquire().release()
    assert not (tmp_path / "a").exists()  # the folders the lease created, gone with it
    (tmp_path / "kept").mkdir()
    Lease(str(tmp_path / "kept"), "demo").acquire().release()
    assert (tmp_path / "kept").is_dir()  # a folder that was there stays


def test_exclusive_create_without_hard_links(tmp_path, monkeypatch):
    """A filesystem without hard links: the lease is created with O_CREAT|O_EXCL instead."""
    import errno

    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported", dst)

    monkeypatch.setattr(leases.os, "link", no_links)
    out = str(tmp_path / "out")
    first = Lease(out, "demo", ttl=3600).acquire()
    try:
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
            Lease(out, "demo").acquire()
    finally:
        first.release()
    assert not os.path.exists(os.path.join(out, LEASE))


def test_expired_lease_is_taken_over_by_exactly_one(where):
    out, raw, put = where
    put(dead_writer_lease(pid=4242))
    a, b = Lease(out, "demo", ttl=3600), Lease(out, "demo", ttl=3600)
    seen = a._store.read()  # both takers read the same expired document ...
    assert b._store.read() == seen
    assert a._store.swap(a._document(time.time()), seen) is True  # ... the first swap wins,
    assert b._store.swap(b._document(time.time()), seen) is False  # the second finds it changed
    assert json.loads(raw())["token"] == a.token


def test_expired_lease_takeover_through_acquire(where, caplog):
    out, raw, put = where
    put(dead_writer_lease(pid=4242))
    with caplog.at_level("WARNING", logger="stepkit.lease"):
        taker = Lease(out, "demo", ttl=3600).acquire()
    try:
        assert taker.took_over["owner"]["pid"] == 4242
        assert "took over the expired lease" in caplog.text and "pid 4242" in caplog.text
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
            Lease(out, "demo").acquire()
    finally:
        taker.release()
    assert raw() is None


def test_live_lease_of_another_host_is_respected(where):
    out, raw, put = where
    put(dead_writer_lease(pid=4242, expired=False))
    with pytest.raises(LeaseHeld, match="on host other-host pid 4242, run manual__x"):
        Lease(out, "demo").acquire()
    assert json.loads(raw())["token"] == "dead-writer-token"


def test_heartbeat_renews_and_a_taken_lease_is_lost(where):
    out, raw, put = where
    lease = Lease(out, "demo", ttl=30, heartbeat=0.2).acquire()
    try:
        first = json.loads(raw())["expires_epoch"]
        wait_for(lambda: json.loads(raw())["expires_epoch"] > first, "a heartbeat renewal", deadline_s=60)
        put(dead_writer_lease(pid=4242, expired=False))  # another writer took it over
        wait_for(lambda: lease.lost, "the heartbeat to notice the takeover", deadline_s=60)
        assert "pid 4242" in lease.lost
        with pytest.raises(LeaseLost, match="lost its lease"):
            lease.check()
    finally:
        lease.release()
    assert json.loads(raw())["token"] == "dead-writer-token"  # a lost lease is not deleted on release


def test_step_that_lost_its_lease_does_not_commit(where):
    out, raw, put = where
    step = Step("demo", out, "1", {"k": 1})
    assert not step.skip()
    step.write_bytes("a.txt", b"A")
    put(dead_writer_lease(pid=4242, expired=False))  # taken over while this writer stalled
    with pytest.raises(LeaseLost, match="pid 4242"):
        step.commit()
    assert read_marker(out) is None
    step.release()


def test_skip_holds_the_lease_only_while_it_checks(where):
    out, raw, put = where
    step = Step("demo", out, "1", {"k": 1})
    assert not step.skip()
    step.write_bytes("a.txt", b"A")
    step.commit()
    assert raw() is None  # released by the commit
    again = Step("demo", out, "1", {"k": 1})
    assert again.skip() and raw() is None
    put(dead_writer_lease(pid=4242, expired=False))  # a writer is replacing the outputs right now
    with pytest.raises(LeaseHeld, match="pid 4242"):
        Step("demo", out, "1", {"k": 1}).skip()  # not "up to date" while another run rewrites them


def test_a_writer_of_the_same_output_is_named_as_such(tmp_path):
    out = str(tmp_path / "out")
    twin = Step("demo", out, "1", {"k": 1})
    other = Lease(out, "demo", fingerprint=twin.fingerprint, ttl=3600).acquire()  # another process's, in effect
    try:
        with pytest.raises(LeaseHeld, match="same fingerprint.*a rerun after it has finished skips") as same:
            twin.skip()
        assert same.value.same_output
        with pytest.raises(LeaseHeld) as exc:
            Step("demo", out, "1", {"k": 2}).skip()
        assert "same fingerprint" not in str(exc.value) and not exc.value.same_output
    finally:
        other.release()


def test_cli_exit_status_busy_for_the_same_output_bad_input_for_another(tmp_path, monkeypatch, capsys):
    """The same output being computed elsewhere is retryable (75: the retry skips once that run
    has committed); a different output into the same prefix is exit 2 (no retry can help)."""
    from stepkit.cli import main

    (tmp_path / "leasestep.py").write_text(
        "from stepkit import Step\n"
        "def add_arguments(p):\n    p.add_argument('--out'); p.add_argument('--k', type=int)\n"
        "def run(a):\n    s = Step('demo', a.out, '1', {'k': a.k})\n    s.skip()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = {"demo": ("leasestep", "")}
    for k, status in ((1, leases.EXIT_BUSY), (2, 2)):
        out = str(tmp_path / f"out{k}")
        held = Lease(out, "demo", fingerprint=Step("demo", out, "1", {"k": 1}).fingerprint, ttl=3600).acquire()
        try:
            assert main("house_test", steps, ["demo", "--out", out, "--k", str(k)]) == status
            assert "being written by another run" in capsys.readouterr().err
        finally:
            held.release()
    assert leases.EXIT_BUSY == 75


def test_settings_are_checked(monkeypatch):
    monkeypatch.setenv(leases.TTL_ENV, "soon")
    with pytest.raises(StepError, match="HOUSE_LEASE_TTL_S='soon' is not a number"):
        leases.settings()
    monkeypatch.setenv(leases.TTL_ENV, "10")
    monkeypatch.setenv(leases.HEARTBEAT_ENV, "10")
    with pytest.raises(StepError, match="HOUSE_LEASE_HEARTBEAT_S=10 must be above 0 and below"):
        leases.settings()
    monkeypatch.delenv(leases.HEARTBEAT_ENV)
    assert leases.settings() == (10.0, 10.0 / 3)


def test_run_id_names_the_airflow_task(monkeypatch):
    for k in (
        "HOUSE_RUN_ID",
        "AIRFLOW_CTX_DAG_ID",
        "AIRFLOW_CTX_DAG_RUN_ID",
        "AIRFLOW_CTX_TASK_ID",
        "AIRFLOW_CTX_TRY_NUMBER",
    ):
        monkeypatch.delenv(k, raising=False)
    assert leases.run_id() is None
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "mirage_pipeline")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "backfill__2026-01-01")
    monkeypatch.setenv("AIRFLOW_CTX_TASK_ID", "ingest")
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "2")
    assert leases.run_id() == "mirage_pipeline/backfill__2026-01-01/ingest/2"
    monkeypatch.setenv("HOUSE_RUN_ID", "r1")
    assert leases.run_id() == "r1"


def test_moto_honours_conditional_writes(s3_endpoint):
    """What the S3 lease relies on, on the tests' store: If-None-Match: * and If-Match on PutObject,
    If-Match on DeleteObject. (If moto stopped honouring them, the lease would fall back to its
    read-back checks only; this test says so first.)"""
    from botocore.exceptions import ClientError

    client = s3_client(s3_endpoint)
    key = "cond/x"
    etag = client.put_object(Bucket=BUCKET, Key=key, Body=b"1", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as exc:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"2", IfNoneMatch="*")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    with pytest.raises(ClientError) as exc:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"2", IfMatch='"0123"')
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    with pytest.raises(ClientError) as exc:
        client.delete_object(Bucket=BUCKET, Key=key, IfMatch='"0123"')
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    client.put_object(Bucket=BUCKET, Key=key, Body=b"2", IfMatch=etag)
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"2"
    client.delete_object(Bucket=BUCKET, Key=key)


def test_s3_step_leaves_no_lease_object(s3_endpoint, monkeypatch, tmp_path):
    for k, v in storage_env(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    out = f"s3://{BUCKET}/steps/{tmp_path.name}"
    step = Step("demo", out, "1", {"k": 1})
    assert not step.skip()
    step.write_bytes("a.txt", b"A")
    step.commit()
    assert list_keys(s3_endpoint, BUCKET, f"steps/{tmp_path.name}/") == [
        f"steps/{tmp_path.name}/{MARKER}",
        f"steps/{tmp_path.name}/a.txt",
    ]


# ----------------------------------------------------------------------------- inputs verified against markers


def _upstream(out: str, files: dict[str, bytes]) -> dict:
    step = Step("up", out, "1", {"files": sorted(files)})
    for rel, data in files.items():
        step.write_bytes(rel, data)
    return step.commit()


@pytest.fixture
def hashes(monkeypatch):
    """Count SHA-256 computations per file URI."""
    counts: dict[str, int] = {}
    real = storage.sha256_of

    def counting(uri):
        key = storage.normalize(uri)
        counts[key] = counts.get(key, 0) + 1
        return real(uri)

    monkeypatch.setattr(storage, "sha256_of", counting)
    return counts


def test_untouched_input_is_hashed_once_per_process(tmp_path, hashes):
    up = str(tmp_path / "up")
    _upstream(up, {"a.bin": b"A" * 1000, "b.json": b"{}"})
    Step("down", str(tmp_path / "down"), "1", {}, inputs=[up])  # registers the upstream marker
    a = storage.normalize(os.path.join(up, "a.bin"))
    hashes.clear()
    for _ in range(3):
        assert storage.read_bytes(a) == b"A" * 1000
    assert hashes.get(a) == 1  # size checked on every read, content hashed once


def test_changed_input_is_refused_naming_the_file(tmp_path):
    up = str(tmp_path / "up")
    _upstream(up, {"a.bin": b"A" * 1000, "b.bin": b"B" * 1000})
    require_committed(up, "--in")
    (tmp_path / "up" / "a.bin").write_bytes(b"A" * 10)  # truncated
    with pytest.raises(StepError, match=r"up/a.bin has 10 bytes, but its marker .*_SUCCESS.json recorded 1000"):
        storage.read_bytes(os.path.join(up, "a.bin"))
    (tmp_path / "up" / "b.bin").write_bytes(b"C" * 1000)  # replaced, same size
    with pytest.raises(StepError, match=r"up/b.bin has SHA-256 .* \(same size, 1000 bytes\)"):
        storage.read_bytes(os.path.join(up, "b.bin"))
    (tmp_path / "up" / "b.bin").unlink()
    with pytest.raises(StepError, match=r"up/b.bin is missing, but its marker"):
        storage.read_bytes(os.path.join(up, "b.bin"))


def test_a_step_writing_a_folder_stops_checking_it(tmp_path):
    up = str(tmp_path / "up")
    _upstream(up, {"a.bin": b"A"})
    require_committed(up, "--in")
    _upstream(up, {"a.bin": b"AA"})  # this process rewrote it (and committed): its own reads are fine
    assert storage.read_bytes(os.path.join(up, "a.bin")) == b"AA"


def test_s3_input_is_verified(s3_endpoint, monkeypatch, tmp_path):
    for k, v in storage_env(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    up = f"s3://{BUCKET}/up/{tmp_path.name}"
    _upstream(up, {"a.bin": b"A" * 100})
    require_committed(up, "--in")
    assert storage.read_bytes(f"{up}/a.bin") == b"A" * 100
    s3_client(s3_endpoint).put_object(Bucket=BUCKET, Key=f"up/{tmp_path.name}/a.bin", Body=b"A" * 50)
    storage.filesystem(up)[0].invalidate_cache()
    with pytest.raises(StepError, match=r"a.bin has 50 bytes, but its marker .* recorded 100"):
        storage.read_bytes(f"{up}/a.bin")


# ----------------------------------------------------------------------------- leases cannot outlive their writer

import errno  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _doc(**over) -> dict:
    """A lease document of a writer on this host (by default: this very process, alive)."""
    now = time.time()
    doc = {
        "lease": 1,
        "token": "other-token",
        "step": "demo",
        "out": "?",
        "owner": {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": None,
            "started": leases._iso(now),
            "local": leases.local_identity(),
        },
        "acquired": leases._iso(now),
        "renewed": leases._iso(now),
        "expires": leases._iso(now + 3600),
        "expires_epoch": now + 3600,
        "ttl_s": 3600,
        "heartbeat_s": 1200,
    }
    for k, v in over.items():
        if k.startswith("owner_"):
            doc["owner"][k[6:]] = v
        else:
            doc[k] = v
    return doc


def _put_local(out: str, doc: dict) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, LEASE)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _py(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    env.pop("HOUSE_LEASE_HEARTBEAT_S", None)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.skipif(leases.local_identity() is None, reason="needs Linux /proc")
def test_killed_local_writer_is_taken_over_at_once(tmp_path, caplog):
    """A writer killed with SIGKILL (no exit handler can run) holding an hour-long lease: the next
    writer on this host takes it over at once instead of waiting for the hour."""
    out = str(tmp_path / "out")
    writer = _py(
        """
        import sys, time
        from stepkit.lease import Lease
        Lease(sys.argv[1], "demo", ttl=3600).acquire()
        print("held", flush=True)
        time.sleep(600)
    """,
        out,
    )
    try:
        assert writer.stdout.readline().strip() == "held", writer.stderr.read()
        doc = json.loads(open(os.path.join(out, LEASE)).read())
        assert doc["owner"]["pid"] == writer.pid and doc["owner"]["local"]["start_ticks"]
        with pytest.raises(LeaseHeld, match=f"pid {writer.pid}"):  # alive: respected
            Lease(out, "demo").acquire()
    finally:
        writer.kill()
        writer.communicate(timeout=60)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="stepkit.lease"):
        taker = Lease(out, "demo").acquire()
    try:
        assert time.monotonic() - started < 5
        assert taker.took_over["owner"]["pid"] == writer.pid
        assert f"pid {writer.pid} no longer runs on this host" in caplog.text
    finally:
        taker.release()
    assert not os.path.exists(os.path.join(out, LEASE))


@pytest.mark.skipif(leases.local_identity() is None, reason="needs Linux /proc")
def test_dead_writer_judged_by_pid_start_time_boot_and_namespace(tmp_path):
    """Only a writer that surely died is taken over early: a pid that now belongs to another process
    (its start time differs) is dead; another boot, pid namespace or host is not judged (the lease
    expires as before); a document without the identity (an older writer) is not judged either."""
    me = leases.local_identity()
    reused = _doc(owner_local={**me, "start_ticks": str(int(me["start_ticks"]) - 1)})  # our pid, not our start
    assert "is now another process" in leases.writer_gone(reused)
    assert leases.writer_gone(_doc()) is None  # this process itself: alive
    for doc in (
        _doc(owner_local={**me, "boot_id": "another-boot"}),
        _doc(owner_local={**me, "pidns": "1"}),
        _doc(owner_host="other-host", owner_pid=999_999),
        _doc(owner_local=None, owner_pid=999_999),
    ):
        assert leases.writer_gone(doc) is None, doc
        with pytest.raises(LeaseHeld):
            Lease(_put_local_dir(tmp_path, doc), "demo").acquire()
    taker = Lease(_put_local_dir(tmp_path, reused), "demo").acquire()
    assert taker.took_over["token"] == "other-token"
    taker.release()


def _put_local_dir(tmp_path, doc) -> str:
    out = str(tmp_path / f"out-{time.monotonic_ns()}")
    _put_local(out, doc)
    return out


def test_expiry_is_capped_by_renewal_plus_ttl(where):
    """A lease whose ``expires_epoch`` lies far in the future (a skewed clock, a corrupt document) holds
    no longer than its last renewal plus its ttl; one renewed more than a ttl in the reader's future
    counts as expired; a consistent live lease of another host is still respected."""
    out, raw, put = where
    now = time.time()
    far = now + 10 * 365 * 86400
    put(
        json.dumps(
            _doc(
                owner_host="other-host",
                renewed=leases._iso(now - 200),
                ttl_s=90,
                expires_epoch=far,
                expires=leases._iso(far),
            )
        ).encode()
    )
    taker = Lease(out, "demo").acquire()
    assert taker.took_over["expires_epoch"] == far
    taker.release()
    put(
        json.dumps(
            _doc(
                owner_host="other-host",
                renewed=leases._iso(far - 90),
                ttl_s=90,
                expires_epoch=far,
                expires=leases._iso(far),
            )
        ).encode()
    )  # clock ten years ahead
    Lease(out, "demo").acquire().release()
    put(
        json.dumps(
            _doc(
                owner_host="other-host", renewed=leases._iso(now), ttl_s=90, expires_epoch=far, expires=leases._iso(far)
            )
        ).encode()
    )
    with pytest.raises(LeaseHeld, match="other-host"):  # renewed just now: held for its ttl
        Lease(out, "demo").acquire()


def test_expiry_is_capped_by_the_files_own_age(tmp_path):
    """Without a usable ``renewed`` time the lease file's modification time (the store's clock)
    plus the ttl bounds it."""
    out = str(tmp_path / "out")
    far = time.time() + 10 * 365 * 86400
    path = _put_local(out, _doc(owner_host="other-host", renewed="never", ttl_s=90, expires_epoch=far))
    with pytest.raises(LeaseHeld):
        Lease(out, "demo").acquire()
    os.utime(path, (time.time() - 200, time.time() - 200))
    Lease(out, "demo").acquire().release()


def test_a_huge_ttl_holds_a_day_at_most_and_the_message_names_the_real_expiry(tmp_path):
    """A lease document claiming a ttl of 30,000 years with no ``expires_epoch`` held its output for
    good while the refusal said it "expires" at a time already past: the ttl a document can claim
    is capped at :data:`MAX_TTL_S`, and the refusal names the expiry this host counts."""
    out = str(tmp_path / "out")
    now = time.time()
    doc = _doc(owner_host="other-host", renewed=leases._iso(now - 60), ttl_s=1e12, expires=leases._iso(now - 30))
    del doc["expires_epoch"]
    path = _put_local(out, doc)
    with pytest.raises(LeaseHeld) as e:  # renewed a minute ago: held, for at most a day after that
        Lease(out, "demo").acquire()
    msg = str(e.value)
    until = leases._iso(now - 60 + leases.MAX_TTL_S)
    assert f"expires {until}" in msg and f"claims it expires {leases._iso(now - 30)}" in msg, msg
    old = now - leases.MAX_TTL_S - 60  # last written more than a day ago: free
    doc["renewed"] = leases._iso(old)
    _put_local(out, doc)
    os.utime(path, (old, old))
    Lease(out, "demo").acquire().release()


def test_the_ttl_setting_is_bounded(monkeypatch):
    monkeypatch.setenv(leases.TTL_ENV, "1e12")  # a writer that died would block its output for 30,000 years
    with pytest.raises(StepError, match="HOUSE_LEASE_TTL_S=1e\\+12 must be above 0 and at most 86400"):
        leases.settings()
    with pytest.raises(StepError, match="at most 86400"):
        Lease("/tmp/x", "demo", ttl=86401)


STEP_SCRIPT = """
import os, signal, sys, time
from stepkit import Step, StepError
mode, out = sys.argv[1], sys.argv[2]
# a process started in the background of a non-interactive shell (CI) inherits SIGINT ignored and
# Python then installs no KeyboardInterrupt handler: behave as a program started from a terminal
signal.signal(signal.SIGINT, signal.default_int_handler)

def main():
    step = Step("demo", out, "1", {"mode": mode})
    if step.skip():
        return 0
    step.write_bytes("part.txt", b"half")
    print("holding", flush=True)
    sys.stdin.readline()  # the test has seen the lease: go on
    if mode == "raise":
        raise RuntimeError("a bug in the step")
    if mode == "exit2":  # a step's own main catching its StepError (waitpred, probe_replay)
        try:
            raise StepError("bad input found after the lease was taken")
        except StepError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if mode == "keyboard":
        raise KeyboardInterrupt
    if mode in ("sigterm", "sigint"):
        # short sleeps, as a working step's loop has: a signal that lands between the interpreter's
        # last check and the start of a sleep is only seen when that sleep ends (CPython), so one
        # 600 s sleep made this test hang about once in eight runs
        for _ in range(6000):
            time.sleep(0.1)
    return 0

sys.exit(main())
"""


@pytest.mark.parametrize(
    "mode,status",
    [
        ("raise", 1),
        ("exit2", 2),
        ("keyboard", -signal.SIGINT),
        ("sigterm", -signal.SIGTERM),
        ("sigint", -signal.SIGINT),
    ],
)
def test_lease_released_on_every_exit_path_outside_the_cli(tmp_path, mode, status):
    """A program that takes a lease through :class:`Step` without the step CLI (its own ``main``,
    as ``waitpred`` and the probe-replay evaluation have): an uncaught exception, exit 2 after a
    caught StepError, KeyboardInterrupt, SIGTERM and SIGINT all give the lease back, and the
    corrected rerun proceeds at once."""
    out = str(tmp_path / "out")
    proc = _py(STEP_SCRIPT, mode, out, stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
    assert os.path.exists(os.path.join(out, LEASE))
    proc.stdin.write("go\n")
    proc.stdin.flush()
    if mode == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif mode == "sigint":
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert not os.path.exists(os.path.join(out, LEASE)), err
    rerun = Step("demo", out, "1", {"mode": "fixed"})
    assert not rerun.skip()
    rerun.release()


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads a thread's signal mask from Linux /proc")
def test_the_heartbeat_thread_leaves_stop_signals_to_the_main_thread(tmp_path):
    """SIGTERM and SIGINT go to any thread that does not block them; one taken by the heartbeat
    thread leaves a main thread blocked in a long system call unaware until it returns. The
    heartbeat thread blocks both; the main thread blocks neither."""
    proc = _py(
        """
        import sys, threading, time
        from stepkit import Step
        step = Step("demo", sys.argv[1], "1", {})
        step.skip()
        for _ in range(200):
            beat = [t for t in threading.enumerate() if t.name == "stepkit-lease-heartbeat"]
            if beat and beat[0].native_id:
                break
            time.sleep(0.01)
        time.sleep(0.2)  # the thread has run its first line
        def blocked(tid):
            for line in open(f"/proc/self/task/{tid}/status"):
                if line.startswith("SigBlk:"):
                    return int(line.split()[1], 16)
        print(blocked(beat[0].native_id), blocked(threading.main_thread().native_id))
        step.release()
    """,
        str(tmp_path / "out"),
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    beat, main = (int(x) for x in out.split())
    for sig in (signal.SIGTERM, signal.SIGINT):
        assert beat & (1 << (sig - 1)), f"the heartbeat thread does not block {sig.name}"
        assert not main & (1 << (sig - 1)), f"the main thread blocks {sig.name}"


def test_sigterm_through_the_step_cli_releases_the_lease(tmp_path):
    """An interrupted step run by the CLI (``synth`` stopped by SIGTERM, as Kubernetes and Airflow
    stop tasks): its lease is gone when the process is."""
    (tmp_path / "sleepstep.py").write_text(
        "import time\nfrom stepkit import Step\n"
        "def add_arguments(p):\n    p.add_argument('--out')\n"
        "def run(a):\n    s = Step('demo', a.out, '1', {})\n    s.skip()\n    s.write_bytes('x', b'x')\n"
        "    print('holding', flush=True)\n    time.sleep(600)\n"
    )
    out = str(tmp_path / "out")
    proc = _py(
        "import sys; sys.path.insert(0, sys.argv[1]); from stepkit.cli import main; "
        "sys.exit(main('house_test', {'demo': ('sleepstep', '')}, ['demo', '--out', sys.argv[2]]))",
        str(tmp_path),
        out,
    )
    assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (-signal.SIGTERM, 143), err
    assert not os.path.exists(os.path.join(out, LEASE)), err


def test_a_forked_child_never_releases_its_parents_lease(tmp_path):
    out = str(tmp_path / "out")
    lease = Lease(out, "demo", ttl=3600).acquire()
    try:
        pid = os.fork()
        if pid == 0:  # a worker process: exits (and would release what it inherited)
            try:
                leases.release_all()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert json.loads(open(os.path.join(out, LEASE)).read())["token"] == lease.token
    finally:
        lease.release()


def _read_only(monkeypatch):
    """The output's file system turns read-only (EROFS: root cannot write it either)."""

    def refuse(self, path, data):
        raise OSError(errno.EROFS, "Read-only file system", path)

    monkeypatch.setattr(leases._Local, "_write", refuse)


def test_up_to_date_output_on_a_read_only_store_skips(tmp_path, monkeypatch, capsys):
    from stepkit.cli import main

    (tmp_path / "rostep.py").write_text(
        "from stepkit import Step\n"
        "def add_arguments(p):\n    p.add_argument('--out'); p.add_argument('--k', type=int)\n"
        "def run(a):\n    s = Step('demo', a.out, '1', {'k': a.k})\n    if s.skip():\n        return 0\n"
        "    s.write_bytes('a.txt', b'A')\n    s.commit()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = {"demo": ("rostep", "")}
    out = str(tmp_path / "out")
    assert main("house_test", steps, ["demo", "--out", out, "--k", "1"]) == 0
    _read_only(monkeypatch)
    capsys.readouterr()
    assert main("house_test", steps, ["demo", "--out", out, "--k", "1"]) == 0  # up to date: skips, as before leases
    assert "skipped (up to date" in capsys.readouterr().out
    assert main("house_test", steps, ["demo", "--out", out, "--k", "2"]) == 2  # would write: refused, no traceback
    err = capsys.readouterr().err
    assert "cannot write there: Read-only file system" in err and "Traceback" not in err
    assert read_marker(out)["params"] == {"k": 1} and not os.path.exists(os.path.join(out, LEASE))


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_stop_between_the_leases_creation_and_its_read_back_leaves_no_lease(where, monkeypatch, stop):
    """Ctrl-C (KeyboardInterrupt) or a stop arriving after this writer's document reached the store
    but before the acquisition returned (the read-back): the step never learns it holds the lease,
    so acquire itself removes it; a corrected rerun is not refused as "being written". Seen under
    load in tests/mirage/test_one_writer_e2e.py's interrupted synth."""
    out, raw, _ = where

    def interrupted(self, now):
        assert raw() is not None  # the document is on the store
        raise stop()

    confirm = Lease._confirm
    monkeypatch.setattr(Lease, "_confirm", interrupted)
    with pytest.raises(stop):
        Lease(out, "demo").acquire()
    assert raw() is None
    monkeypatch.setattr(Lease, "_confirm", confirm)
    Lease(out, "demo").acquire().release()  # free for the next writer
