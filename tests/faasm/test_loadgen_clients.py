"""Load driver, several clients, without load: the controller's merge (the union of the
clients' histograms), the clients' shares of the load, the spec's checks and the clear error
where namespaces cannot be made. The runs are in test_loadgen_clients_e2e.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from faasm_testutil import ScriptedServer
from hdrh.histogram import HdrHistogram

import faasm_tasks.loadgen.controller as controller
from faasm_tasks.loadgen import (
    LoadSpec,
    NetnsError,
    merge_histograms,
    netns_unavailable,
    new_hist,
    run_load,
)
from faasm_tasks.loadgen.controller import client_spec

ROOT = Path(__file__).resolve().parents[2]
NO_NETNS = netns_unavailable()
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=f"network namespaces unavailable: {NO_NETNS}")
PERCENTILES = (1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100)


def ok_server(host: str = "127.0.0.1") -> ScriptedServer:
    return ScriptedServer(lambda method, path, headers, body: (200, b"ok"), host=host)


def same_histograms(a: HdrHistogram, b: HdrHistogram) -> None:
    assert a.get_total_count() == b.get_total_count()
    assert a.get_min_value() == b.get_min_value() and a.get_max_value() == b.get_max_value()
    assert a.get_mean_value() == pytest.approx(b.get_mean_value())
    assert [a.get_value_at_percentile(p) for p in PERCENTILES] == [b.get_value_at_percentile(p) for p in PERCENTILES]


def test_merged_histogram_is_the_union_of_the_clients():
    rng = random.Random(7)
    parts = [new_hist() for _ in range(3)]
    union = new_hist()
    for i, h in enumerate(parts):  # different shapes per client: a merge that dropped one would show
        for _ in range(5000):
            v = int(rng.lognormvariate(7 + i, 1.0 + 0.3 * i)) + 1
            h.record_value(v)
            union.record_value(v)
    merged = merge_histograms([h.encode().decode() for h in parts])
    same_histograms(merged, union)
    assert merged.get_total_count() == 15000
    # and a merge is not a copy of one part
    assert merged.get_value_at_percentile(99) != parts[0].get_value_at_percentile(99)


def test_client_shares_add_up_to_the_spec():
    spec = LoadSpec(url="http://127.0.0.1:1/", mode="open", rate=1000, connections=7, processes=3, clients=3)
    subs = [client_spec(spec, i) for i in range(3)]
    assert sum(s.rate for s, _ in subs) == pytest.approx(1000)
    assert [s.connections for s, _ in subs] == [3, 2, 2]
    assert [s.processes for s, _ in subs] == [1, 1, 1]
    assert [off for _, off in subs] == pytest.approx([0, 0.001, 0.002])  # slot j of the one schedule: j / rate
    assert all(s.clients == 1 and s.ready_timeout_s == 0 for s, _ in subs)


def test_spec_refuses_bad_client_settings():
    with pytest.raises(ValueError, match="client_isolation"):
        LoadSpec(url="http://127.0.0.1:1/", clients=2, connections=2, client_isolation="vm")
    with pytest.raises(ValueError, match="need a connection each"):
        LoadSpec(url="http://127.0.0.1:1/", clients=3, connections=2)
    with pytest.raises(ValueError, match="their number"):
        LoadSpec(url="http://127.0.0.1:1/", clients=3, connections=4, client_hosts=("a", "b"))
    assert LoadSpec(url="http://127.0.0.1:1/", connections=2, client_hosts=("a", "b")).clients == 2


def test_netns_refused_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(controller, "netns_unavailable", lambda: "cannot create a network namespace (test)")
    spec = LoadSpec(url="http://127.0.0.1:9/", mode="open", rate=50, connections=2, duration_s=1, clients=2)
    with pytest.raises(NetnsError, match="2 load clients in network namespaces: cannot create a network namespace"):
        run_load(spec)


def test_knative_client_hosts_reach_the_load_spec_through_the_endpoints():
    import argparse

    from faasm_tasks.common import add_common
    from faasm_tasks.targets.knative import KnativeTarget

    p = argparse.ArgumentParser()
    add_common(p)
    args = p.parse_args(["--run-id", "r1", "--results", "/tmp/x", "--client-hosts", "load-a, load-b"])
    t = KnativeTarget.from_args(args)
    assert t.client_hosts == ("load-a", "load-b")
    t.invoke_url, t.upload_url = "http://192.0.2.7:80", "http://192.0.2.8:8002"
    ep = t.endpoints()
    assert ep.extra == {"client_hosts": ["load-a", "load-b"]}
    assert t.describe()["client_hosts"] == ["load-a", "load-b"]
    plain = KnativeTarget(invoke_url="http://192.0.2.7:80", upload_url="http://192.0.2.8:8002")
    assert plain.endpoints().extra == {} and "client_hosts" not in plain.describe()


def test_load_points_take_their_clients_from_the_spec_default_one():
    from types import SimpleNamespace

    from faasm_tasks.catalogue import get_experiment, resolve
    from faasm_tasks.points import load_clients, point_key, refuse_inert
    from faasm_tasks.targets.base import Endpoints
    from stepkit import StepError

    def args(**kw):
        return SimpleNamespace(**{"mode": None, "rate": None, "threads": None, "driver": "builtin", **kw})

    lat = resolve(get_experiment("tf_inference_latency"), "wasm", "local")
    assert lat.driver.clients == 1 and lat.driver.client_isolation == "netns"
    point = {"duration_s": 5}
    assert "clients" not in point_key(args(), lat, point)  # one client: the folders of today's points
    assert point_key(args(clients=2), lat, point)["clients"] == 2
    assert load_clients(args(), lat) == 1 and load_clients(args(clients=3), lat) == 3
    hosts = Endpoints("http://x/", "http://y/", extra={"client_hosts": ["a", "b"]})
    assert load_clients(args(clients=3), lat, hosts) == 2  # one client per host
    assert point_key(args(), lat, point, hosts)["clients"] == 2
    sgd = resolve(get_experiment("sgd_reuters_svm"), "wasm", "local")
    with pytest.raises(StepError, match="--clients, --client-isolation: sgd_reuters_svm is a call workload"):
        refuse_inert(args(clients=2, client_isolation="process"), sgd)
    with pytest.raises(StepError, match="--clients 0: load clients are 1..63"):
        refuse_inert(args(clients=0), lat)


def test_catalogue_driver_clients_are_checked():
    from faasm_tasks.catalogue import DriverSettings
    from stepkit import StepError

    d = DriverSettings.from_catalogue({"clients": 2, "client_isolation": "process"})
    assert (d.clients, d.client_isolation) == (2, "process")
    with pytest.raises(StepError, match="client_isolation 'vm'; known: netns, process"):
        DriverSettings.from_catalogue({"client_isolation": "vm"})
