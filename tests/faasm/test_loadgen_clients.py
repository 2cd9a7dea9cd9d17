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
