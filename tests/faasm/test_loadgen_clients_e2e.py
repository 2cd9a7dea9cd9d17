"""Load driver, several clients, live: plain-process clients, clients started by a command
per host, clients in network namespaces of their own (made and removed by the run, also on
SIGTERM; skipped where namespaces cannot be made). A few seconds of load each against a local
server; functional, never timed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from faasm_testutil import ScriptedServer
from hdrh.histogram import HdrHistogram

from faasm_tasks.loadgen import ClientNamespaces, LoadSpec, merge_histograms, netns_unavailable, run_clients, run_load
from faasm_tasks.loadgen.netns import PREFIX, leftovers

ROOT = Path(__file__).resolve().parents[2]
NO_NETNS = netns_unavailable()
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=f"network namespaces unavailable: {NO_NETNS}")
PERCENTILES = (1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100)


def ok_server(host: str = "127.0.0.1") -> ScriptedServer:
    return ScriptedServer(lambda method, path, headers, body: (200, b"ok"), host=host)


def client_children(pid: int) -> list[psutil.Process]:
    """The load clients among ``pid``'s children (the ``ip`` commands it runs come and go)."""
    out = []
    for c in psutil.Process(pid).children():
        try:
            if "client" in c.cmdline():
                out.append(c)
        except psutil.Error:
            pass
    return out


def same_histograms(a: HdrHistogram, b: HdrHistogram) -> None:
    assert a.get_total_count() == b.get_total_count()
    assert a.get_min_value() == b.get_min_value() and a.get_max_value() == b.get_max_value()
    assert [a.get_value_at_percentile(p) for p in PERCENTILES] == [b.get_value_at_percentile(p) for p in PERCENTILES]


def check_merged(s: dict, n: int, rate: float, duration: float) -> None:
    detail = s["clients_detail"]
    assert s["clients"] == n and len(detail) == n
    for k in ("requests_ok", "requests_all", "scheduled", "sent", "late"):
        assert s[k] == sum(d[k] for d in detail), k
    assert all(d["rate"] == pytest.approx(rate / n) for d in detail)
    assert s["scheduled"] == pytest.approx(rate * duration, abs=n)
    assert s["requests_ok"] > 0 and s["errors_total"] == 0
    # the run's histogram is the union of its clients'
    same_histograms(HdrHistogram.decode(s["histogram"]), merge_histograms(s["client_histograms"]))
    assert HdrHistogram.decode(s["histogram"]).get_total_count() == s["requests_ok"]
    assert HdrHistogram.decode(s["send_lag_histogram"]).get_total_count() == s["sent"]


def test_two_plain_process_clients_drive_the_rate_together():
    with ok_server() as srv:
        spec = LoadSpec(
            url=srv.url + "/",
            mode="open",
            rate=100,
            connections=4,
            duration_s=2,
            timeout_s=2,
            method="GET",
            clients=2,
            client_isolation="process",
        )
        s = run_load(spec)
    check_merged(s, 2, 100, 2)
    assert s["client_isolation"] == "process"
    assert len({d["index"] for d in s["clients_detail"]}) == 2


def test_clients_on_hosts_start_by_the_client_command():
    # the remote path (a command per host) with a command that starts the client here
    with ok_server() as srv:
        spec = LoadSpec(
            url=srv.url + "/",
            mode="closed",
            connections=2,
            duration_s=1.5,
            timeout_s=2,
            method="GET",
            client_hosts=("alpha", "beta"),
            client_command="env FAASM_LOAD_CLIENT_HOST={host} {python} -m faasm_tasks.loadgen client",
        )
        s = run_load(spec)
    assert s["client_isolation"] == "hosts"
    assert [d["host"] for d in s["clients_detail"]] == ["alpha", "beta"]
    assert all(d["requests_ok"] > 0 for d in s["clients_detail"])
    assert s["requests_ok"] == sum(d["requests_ok"] for d in s["clients_detail"])


def test_a_client_that_cannot_reach_the_endpoint_fails_the_run_naming_it():
    spec = LoadSpec(
        url="http://127.0.0.1:9/",
        mode="open",
        rate=50,
        connections=2,
        duration_s=1,
        clients=2,
        client_isolation="process",
    )
    with pytest.raises(RuntimeError, match=r"load client \d failed: client \d .* cannot connect to 127.0.0.1:9"):
        run_load(spec)


def mine() -> list[str]:
    return leftovers(f"{PREFIX}{os.getpid()}")


@needs_netns
def test_clients_in_their_own_namespaces_have_their_own_addresses():
    with ClientNamespaces(2) as ns:
        with ok_server(host=ns.endpoint_address) as srv:
            spec = LoadSpec(
                url=srv.url + "/",
                mode="open",
                rate=100,
                connections=4,
                duration_s=2,
                timeout_s=2,
                method="GET",
                clients=2,
            )
            s = run_clients(spec, namespaces=ns)
        assert srv.peers == {ns.client_address(0), ns.client_address(1)}
        assert [d["address"] for d in s["clients_detail"]] == [ns.client_address(0), ns.client_address(1)]
    check_merged(s, 2, 100, 2)
    assert s["client_isolation"] == "netns"
    assert mine() == []


@needs_netns
def test_a_run_makes_and_removes_its_namespaces():
    # a loopback URL: the clients reach the endpoint on the host's veth address (it listens on
    # every address; the namespaces reach nothing beyond this host)
    before = mine()
    with ok_server(host="0.0.0.0") as srv:
        spec = LoadSpec(
            url=f"http://127.0.0.1:{srv.port}/",
            mode="open",
            rate=60,
            connections=2,
            duration_s=1.5,
            timeout_s=2,
            method="GET",
            clients=2,
        )
        s = run_load(spec)
    check_merged(s, 2, 60, 1.5)
    assert {d["address"] for d in s["clients_detail"]} == srv.peers
    assert all(p.startswith("10.") for p in srv.peers)
    assert before == [] and mine() == []


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_stopped_run_stops_its_clients_and_removes_the_namespaces(sig):
    # SIGTERM: the run's own finally blocks (exit 143); SIGKILL: no finally runs, the guard
    # the namespaces were made under removes them once the process is gone
    with ok_server(host="0.0.0.0") as srv:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(
            [sys.executable, "-m", "faasm_tasks.loadgen", "run", "--url", f"http://127.0.0.1:{srv.port}/"]
            + ["--rate", "50", "--duration", "60", "--connections", "2", "--clients", "2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        tag = f"{PREFIX}{proc.pid}"
        try:
            deadline = time.monotonic() + 30
            clients: list[psutil.Process] = []
            while time.monotonic() < deadline:  # running: two clients, requests arriving
                clients = client_children(proc.pid)
                if len(clients) == 2 and len(srv.requests) > 10:
                    break
                time.sleep(0.1)
            made = leftovers(tag)  # 2 namespaces, the host ends of 2 veths
            assert len(clients) == 2 and len(made) == 4, made
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == (143 if sig == signal.SIGTERM else -9), err
    deadline = time.monotonic() + 20
    while leftovers(tag) and time.monotonic() < deadline:  # SIGKILL: the guard's clean-up
        time.sleep(0.2)
    assert leftovers(tag) == []
    psutil.wait_procs(clients, timeout=5)
    assert not [c for c in clients if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_a_load_point_runs_its_clients_through_the_load_spec(tmp_path):
    """The run step's load point with the catalogue's driver.clients = 2 (plain processes):
    the spec it records says 2 clients, the summary is merged, each client's histogram is kept."""
    import json
    from types import SimpleNamespace

    from faasm_tasks.catalogue import DriverSettings
    from faasm_tasks.points import PointContext, Request, load_point
    from faasm_tasks.targets.base import Endpoints

    class Att:
        def write_text(self, name, text):
            (tmp_path / name).write_text(text)

        def write_json(self, name, obj):
            (tmp_path / name).write_text(json.dumps(obj, default=str))

    drv = DriverSettings(kind="load", mode="open", rate=100, connections=4, warmup_s=0, ready_timeout_s=5, clients=2)
    hooks = {"request": lambda ctx, point: Request(user="u", function="f", body=b"{}"), "verify": None}
    plan = SimpleNamespace(system="native", driver=drv, workload=SimpleNamespace(hook=hooks.get))
    args = SimpleNamespace(
        threads=None,
        mode=None,
        rate=None,
        driver="builtin",
        min_requests=10,
        max_late_fraction=0.5,
        clients=None,
        client_isolation="process",
    )
    with ok_server() as srv:
        ctx = PointContext(
            args=args,
            plan=plan,
            target=None,
            endpoints=Endpoints(srv.url + "/", srv.url + "/"),
            invoker=None,
            upload=None,
            health=lambda: None,
        )
        ok, metrics, err, invalid = load_point(ctx, Att(), {"duration_s": 2}, budget=60)
    assert ok, err
    spec = json.loads((tmp_path / "load_spec.json").read_text())
    assert (spec["clients"], spec["client_isolation"]) == (2, "process")
    assert metrics["clients"] == 2 and metrics["client_isolation"] == "process"
    assert metrics["scheduled"] == pytest.approx(200, abs=2) and metrics["requests_ok"] > 100
    parts = [HdrHistogram.decode((tmp_path / f"histogram.client{i}.hdr").read_text().strip()) for i in (0, 1)]
    merged = HdrHistogram.decode((tmp_path / "histogram.hdr").read_text().strip())
    assert merged.get_total_count() == sum(p.get_total_count() for p in parts) == metrics["requests_ok"]
    assert "client_histograms" not in json.loads((tmp_path / "latency.json").read_text())


def test_a_killed_client_fails_the_run_at_once_and_the_other_is_stopped():
    import threading

    box: dict = {}
    with ok_server() as srv:
        spec = LoadSpec(
            url=srv.url + "/",
            mode="open",
            rate=50,
            connections=2,
            duration_s=60,
            method="GET",
            clients=2,
            client_isolation="process",
        )

        def go():
            try:
                box["summary"] = run_load(spec)
            except Exception as exc:  # noqa: BLE001 - the test's subject
                box["error"] = exc

        th = threading.Thread(target=go, daemon=True)
        th.start()
        me = psutil.Process()
        deadline = time.monotonic() + 30
        clients: list[psutil.Process] = []
        while time.monotonic() < deadline and not (len(clients) == 2 and len(srv.requests) > 5):
            clients = client_children(me.pid)
            time.sleep(0.1)
        assert len(clients) == 2
        clients[1].kill()
        killed_at = time.monotonic()
        th.join(30)
    assert not th.is_alive() and time.monotonic() - killed_at < 15
    assert "summary" not in box
    assert "load client" in str(box["error"]) and "exited (-9)" in str(box["error"]), box["error"]
    psutil.wait_procs(clients, timeout=5)
    assert not [c for c in clients if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


STEP_LIKE = """
import sys
from stepkit.procs import run_trapped
from faasm_tasks.loadgen import LoadSpec, run_load
from faasm_tasks.points import bounded

def main(argv):
    spec = LoadSpec(url=sys.argv[1], mode="open", rate=50, connections=2, duration_s=60, method="GET", clients=2)
    bounded(lambda: run_load(spec), 120, "load driver")  # as the run step's load point: a driver thread
    return 0

sys.exit(run_trapped(main, "step"))
"""


@needs_netns
def test_sigterm_to_a_step_whose_driver_thread_runs_the_clients_leaves_nothing():
    # the step's SIGTERM ends its main thread while the controller runs in the driver thread:
    # the namespaces go at interpreter exit, the clients with their parent
    with ok_server(host="0.0.0.0") as srv:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(
            [sys.executable, "-c", STEP_LIKE, f"http://127.0.0.1:{srv.port}/"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        tag = f"{PREFIX}{proc.pid}"
        try:
            deadline = time.monotonic() + 30
            clients: list[psutil.Process] = []
            while time.monotonic() < deadline and not (len(clients) == 2 and len(srv.requests) > 10):
                clients = client_children(proc.pid)
                time.sleep(0.1)
            assert len(clients) == 2 and len(leftovers(tag)) == 4
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 143, err
    assert leftovers(tag) == []
    psutil.wait_procs(clients, timeout=5)
    assert not [c for c in clients if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
