"""Inputs are data, not reach: a path or URI a DAG param carries is read only under the roots the
deployment allows (``stepkit.reach``), and a file that is no trace is described, never quoted.

Each refusal here is made before anything is opened or fetched: the HTTP server the URL tests
point at counts its requests, and a secret file outside the roots never shows in any message.
"""

from __future__ import annotations

import gzip
import http.server
import os
import threading

import pytest

from mirage_tasks.__main__ import STEPS as MIRAGE_STEPS
from stepkit import reach, storage
from stepkit.cli import main

SECRET = "root:$6$s3cr3tHASH:19000:0:99999:7:::"


@pytest.fixture
def roots(tmp_path):
    """An allowed storage root and shipped-traces folder, a secret beside them (outside both)."""
    store, traces = tmp_path / "storage", tmp_path / "traces"
    store.mkdir()
    traces.mkdir()
    (traces / "kth.swf").write_text("; UnixStartTime: 0\n")
    (store / "in").mkdir()
    (store / "in" / "ok.log").write_text("x\n")
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    return {"store": store, "traces": traces, "secret": secret, "list": [str(store), str(traces)]}


@pytest.fixture
def http_server():
    """A server on 127.0.0.1 recording every request path (none may arrive)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(SECRET.encode())

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_the_storage_root_and_the_shipped_traces_are_allowed(roots):
    for uri in (
        str(roots["store"] / "in" / "ok.log"),
        "file://" + str(roots["traces"] / "kth.swf"),
        str(roots["store"]),
        str(roots["store"] / "not-yet" / "out"),
    ):
        assert reach.why_refused(uri, roots["list"]) is None, uri
    assert reach.why_refused("s3://bucket/house/x/trace.gz", ["s3://bucket/house"]) is None


@pytest.mark.parametrize(
    "uri, why",
    [
        ("http://127.0.0.1:9/x", "scheme http://"),
        ("https://metadata.internal/latest", "scheme https://"),
        ("ftp://example.org/x", "scheme ftp://"),
        ("gs://bucket/x", "scheme gs://"),
        ("simplecache::s3://bucket/house/x", "chained URL"),
        ("s3://other-bucket/x", "scheme s3://"),
        ("/proc/self/environ", "/proc is never an input"),
        ("/sys/class/net", "/sys is never an input"),
        ("/dev/zero", "/dev is never an input"),
        ("file:///etc/shadow", "outside the allowed roots"),
        ("/etc/shadow", "outside the allowed roots"),
        ("~/.aws/credentials", "outside the allowed roots"),
        ("file://host/etc/passwd", "with a host"),
        ("relative/trace.log", "outside the allowed roots"),
        ("", "not a path"),
        ("/x\n/y", "line break"),
    ],
)
def test_refused_by_name(roots, uri, why):
    with pytest.raises(reach.Refused) as exc:
        reach.check(uri, roots["list"], "param trace")
    assert str(exc.value).startswith("param trace ") and why in str(exc.value), exc.value


def test_a_remote_root_allows_its_own_prefix_only():
    allowed = ["s3://bucket/house"]
    assert "outside" in reach.why_refused("s3://bucket/housekeeping/x", allowed)
    assert "outside" in reach.why_refused("s3://bucket/other", allowed)
    assert "'..'" in reach.why_refused("s3://bucket/house/../secrets/x", allowed)


def test_dot_dot_is_refused_even_where_it_would_land_inside(roots):
    inside = f"{roots['store']}/in/../in/ok.log"
    assert "'..'" in reach.why_refused(inside, roots["list"])
    escape = f"{roots['store']}/../shadow"
    assert "'..'" in reach.why_refused(escape, roots["list"])
    assert "'..'" in reach.why_refused(f"file://{roots['traces']}/./kth.swf", roots["list"])


def test_a_symlink_inside_a_root_leading_out_is_refused(roots):
    link = roots["store"] / "in" / "innocent.log"
    link.symlink_to(roots["secret"])
    assert "symbolic link" in reach.why_refused(str(link), roots["list"])
    to_proc = roots["store"] / "in" / "env"
    to_proc.symlink_to("/proc/self/environ")
    assert "/proc" in reach.why_refused(str(to_proc), roots["list"])
    inside = roots["store"] / "in" / "alias.log"  # a link that stays inside is fine
    inside.symlink_to(roots["store"] / "in" / "ok.log")
    assert reach.why_refused(str(inside), roots["list"]) is None


def test_a_root_that_is_a_symlink_is_compared_by_its_real_path(tmp_path, roots):
    alias = tmp_path / "store-alias"
    alias.symlink_to(roots["store"])
    assert reach.why_refused(str(roots["store"] / "in" / "ok.log"), [str(alias)]) is None


def test_a_fifo_or_device_is_not_a_file(roots):
    fifo = roots["store"] / "in" / "pipe"
    os.mkfifo(fifo)
    assert "FIFO" in reach.why_refused(str(fifo), roots["list"])


def test_storage_refuses_outside_the_roots_only_in_a_dag_step(roots, monkeypatch, http_server):
    url, hits = http_server
    # a plain shell: local paths as before
    monkeypatch.delenv(reach.ENV, raising=False)
    assert storage.read_bytes(str(roots["secret"])).decode().startswith("root:")
    # a DAG step (the house factory sets the roots): refused before opening or fetching anything
    monkeypatch.setenv(reach.ENV, ",".join(roots["list"]))
    for uri in (
        str(roots["secret"]),
        "/proc/self/environ",
        url + "/latest/meta-data",
        "file://" + str(roots["secret"]),
    ):
        for call in (storage.read_bytes, storage.exists, storage.size_of, storage.sha256_of):
            with pytest.raises(reach.Refused) as exc:
                call(uri)
            assert SECRET not in str(exc.value)
    assert hits == []
    assert storage.read_bytes(str(roots["store"] / "in" / "ok.log")) == b"x\n"


def _ingest(argv):
    return main("mirage_tasks", MIRAGE_STEPS, ["ingest", *argv])


@pytest.mark.parametrize("which", ["secret", "environ", "http", "https"])
def test_ingest_in_a_dag_step_refuses_naming_the_flag(roots, monkeypatch, capsys, http_server, which):
    url, hits = http_server
    trace = {
        "secret": str(roots["secret"]),
        "environ": "/proc/self/environ",
        "http": url + "/x",
        "https": url.replace("http:", "https:") + "/x",
    }[which]
    monkeypatch.setenv(reach.ENV, ",".join(roots["list"]))
    out = roots["store"] / "out"
    assert _ingest(["--trace", trace, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert "--trace" in err and "refused" in err, err
    assert SECRET not in err and "s3cr3t" not in err
    assert hits == [] and not out.exists()


def test_ingest_describes_a_file_that_is_no_trace_never_quoting_it(tmp_path, capsys):
    """From a plain shell (any local path): the secret is read, and the error says what it looks like."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\ndaemon:*:19000:0:99999:7:::\n")
    assert _ingest(["--trace", str(secret), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown trace format" in err and "bytes of text, 2 line(s)" in err, err
    assert "root" not in err.replace(str(tmp_path), "") and "s3cr3t" not in err
    fake_gz = tmp_path / "t.log.gz"
    fake_gz.write_text(SECRET)
    assert _ingest(["--trace", str(fake_gz), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and f"{len(SECRET)} bytes of text" in err, err
    assert "b'ro'" not in err  # gzip's own message: "Not a gzipped file (b'ro')"


def test_rejected_rows_name_line_and_field_not_the_value(tmp_path, capsys):
    trace = tmp_path / "t.txt"
    trace.write_text(
        "JobID|Submit|Start|End|Timelimit|NNodes|State\n"
        "1|2023-01-01T00:00:00|2023-01-01T00:01:00|2023-01-01T01:00:00|01:00:00|2|COMPLETED\n"
        f"2|{SECRET}|2023-01-01T00:01:00|2023-01-01T01:00:00|{SECRET}|2|COMPLETED\n"
    )
    assert (
        _ingest(["--trace", str(trace), "--out", str(tmp_path / "o"), "--timezone", "UTC", "--max-bad-rows", "0"]) == 2
    )
    err = capsys.readouterr().err
    assert "line 3: Submit (" in err and "s3cr3t" not in err, err


@pytest.mark.parametrize(
    "head, kind",
    [
        (b"", "empty"),
        (gzip.compress(b"x", mtime=0), "gzip data"),
        (b"\x00\x01\x02\x03", "binary data"),
        (b"PAR1....", "Parquet data"),
        (b"a b\nc\n", "text, 2 line(s)"),
    ],
)
def test_describe_bytes_says_the_kind_never_the_content(head, kind):
    text = reach.describe_bytes(head)
    assert kind in text and f"{len(head)} bytes" in text or head == b""


def test_flags_naming_finds_both_spellings():
    assert reach.flags_naming("/x", ["ingest", "--trace", "/x", "--out=/x", "--y", "/z"]) == ["--trace", "--out"]


def test_the_house_factory_and_stepkit_agree_on_the_variable():
    from house import config as house_config

    assert house_config.INPUT_ROOTS_ENV == reach.ENV


def test_a_step_reads_its_own_package_files_in_a_dag_step(roots, monkeypatch):
    """The Faasm catalogue and the packaged profiles ship with the step's code: readable whatever the
    roots (stepkit.cli.dispatch allows the running package's folder), no other package's."""
    import faasm_tasks

    monkeypatch.setattr(reach, "_packages", [])
    monkeypatch.setenv(reach.ENV, ",".join(roots["list"]))
    schema = os.path.join(os.path.dirname(faasm_tasks.__file__), "experiments", "schema.json")
    with pytest.raises(reach.Refused):
        storage.read_bytes(schema)
    reach.allow_package("faasm_tasks")
    assert storage.read_bytes(schema).startswith(b"{")
    with pytest.raises(reach.Refused):
        storage.read_bytes(str(roots["secret"]))


def test_the_pipeline_params_a_step_opens():
    """trace always; synth_profile and cluster_config only when they are not packaged names."""
    from mirage_tasks.run.runconf import MirageRun, input_params

    assert input_params(MirageRun()) == {}  # no trace, the packaged ls6-a100 profile, the ls6 preset
    run = MirageRun(trace="/t.log", synth_profile="s3://b/p.json", cluster_config="/etc/passwd")
    assert input_params(run) == {"trace": "/t.log", "synth_profile": "s3://b/p.json", "cluster_config": "/etc/passwd"}


def test_a_folder_the_deployment_names_in_the_environment_is_readable(tmp_path, monkeypatch):
    """A Faasm catalogue of one's own (``FAASM_CATALOGUE_DIR``, the deployment's environment: a form
    sets none) is read by a DAG step; a folder beside it stays refused."""
    from faasm_tasks import catalogue
    from stepkit import reach

    own, other = tmp_path / "catalogue", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    monkeypatch.setenv(reach.ENV, str(tmp_path / "storage"))
    monkeypatch.setattr(reach, "_packages", list(reach._packages))
    with pytest.raises(reach.Refused):
        reach.enforce(str(own / "mine.yaml"))
    monkeypatch.setenv(catalogue.ENV_DIRS, str(own))
    assert own in catalogue._dirs(None)
    reach.enforce(str(own / "mine.yaml"))  # now the deployment's word
    with pytest.raises(reach.Refused):
        reach.enforce(str(other / "x.yaml"))
    # a folder only passed as an extra directory (a flag) is not widened into the roots
    catalogue._dirs([str(other)])
    with pytest.raises(reach.Refused):
        reach.enforce(str(other / "x.yaml"))
