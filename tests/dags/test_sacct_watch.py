"""The sacct export watcher (``house.watch``): one event per new export file with its day, none
for a file announced before (also after a restart, through the asset's state store), none and a
clear log line for a name without a day; opt-in by setting, and the allowed roots enforced."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from conftest import load_dag

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _fresh_variable_cache():
    from house.config import clear_variable_cache

    clear_variable_cache()
    yield
    clear_variable_cache()


class FakeStore:
    """The asset state store's async accessors, kept in a dict (the metadata database's stand-in)."""

    def __init__(self, data=None):
        self.data = dict(data or {})

    async def aget(self, key, default=None):
        return self.data.get(key, default)

    async def aset(self, key, value):
        self.data[key] = value


def _trigger(folder, store=None, **kw):
    from house.watch import SacctExportTrigger

    t = SacctExportTrigger(prefix=f"file://{folder}", roots=[str(folder.parent)], poll_interval=0.01, **kw)
    t.asset_state_store = store
    return t


async def _events(trigger, timeout: float = 0.5) -> list[dict]:
    """The events ``trigger.run()`` yields within ``timeout`` seconds (polling every 10 ms), taken
    as the triggerer takes them: the generator resumes after each one."""
    out: list[dict] = []
    gen = trigger.run()

    async def take():
        async for ev in gen:
            out.append(ev.payload)

    try:
        await asyncio.wait_for(take(), timeout)
    except TimeoutError:
        pass
    finally:
        await gen.aclose()
    return out


def test_a_trigger_closed_before_it_resumes_announces_the_file_again(tmp_path):
    """At least once: the file is recorded when the event has been taken (the generator resumed),
    so a triggerer stopped in between announces it again after a restart."""
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "ls6-2023-01-10.log").write_bytes(b"x")
    store = FakeStore()

    async def first_then_close(t):
        gen = t.run()
        ev = await gen.__anext__()
        await gen.aclose()
        return ev.payload["day"]

    assert asyncio.run(first_then_close(_trigger(folder, store))) == "2023-01-10"
    assert store.data == {}
    assert [e["day"] for e in asyncio.run(_events(_trigger(folder, store)))] == ["2023-01-10"]
    assert store.data == {"seen": {"ls6-2023-01-10.log": "2023-01-10"}}


def test_new_file_gives_an_event_with_its_day_old_file_none(tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "ls6-2023-01-10.log.gz").write_bytes(b"x")
    store = FakeStore()
    t = _trigger(folder, store, timezone="America/Chicago")
    assert asyncio.run(_events(t)) == [
        {
            "uri": f"file://{folder}/ls6-2023-01-10.log.gz",
            "day": "2023-01-10",
            "name": "ls6-2023-01-10.log.gz",
            "timezone": "America/Chicago",
        }
    ]
    # the same trigger: nothing new, no event; a new file: its event only
    assert asyncio.run(_events(t, timeout=0.3)) == []
    (folder / "ls6-2023-01-11.log.gz").write_bytes(b"x")
    assert [e["day"] for e in asyncio.run(_events(t, timeout=0.5))] == ["2023-01-11"]
    assert store.data["seen"] == {"ls6-2023-01-10.log.gz": "2023-01-10", "ls6-2023-01-11.log.gz": "2023-01-11"}

    # a restarted triggerer (a new trigger, the same state store): old files give no event
    (folder / "ls6-2023-01-12.log.gz").write_bytes(b"x")
    again = _trigger(folder, FakeStore(store.data))
    assert [e["day"] for e in asyncio.run(_events(again, timeout=0.5))] == ["2023-01-12"]


def test_two_files_two_events_oldest_day_first(tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    for name in ("b-2023-02-02.log", "a-2023-02-01.log"):
        (folder / name).write_bytes(b"x")
    got = asyncio.run(_events(_trigger(folder)))
    assert [(e["name"], e["day"]) for e in got] == [
        ("a-2023-02-01.log", "2023-02-01"),
        ("b-2023-02-02.log", "2023-02-02"),
    ]


def test_bad_names_log_clearly_and_give_no_event(tmp_path, capsys):
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "ls6-latest.log.gz").write_bytes(b"x")
    (folder / "ls6-2023-02-30.log").write_bytes(b"x")
    (folder / "ls6-2023-03-01.log.part").write_bytes(b"x")  # an upload in progress: ignored quietly
    (folder / "_SUCCESS.json").write_bytes(b"{}")
    (folder / "sub-2023-03-02").mkdir()  # a folder is not an export
    outside = tmp_path / "elsewhere-2023-03-03.log"
    outside.write_bytes(b"x")
    os.symlink(outside, folder / "link-2023-03-03.log")
    t = _trigger(folder)
    assert asyncio.run(_events(t, timeout=0.3)) == []
    text = capsys.readouterr().out  # the triggerer's structured log
    assert "sacct export 'ls6-latest.log.gz': no day (YYYY-MM-DD) in its name" in text
    assert "sacct export 'ls6-2023-02-30.log': '2023-02-30' is not a date" in text
    assert "link-2023-03-03.log refused: a link leading out of" in text
    # logged once each, not every poll
    assert text.count("ls6-latest.log.gz") == 1
    assert ".part" not in text and "_SUCCESS" not in text


def test_missing_folder_waits_quietly_then_fires(tmp_path):
    folder = tmp_path / "exports"
    t = _trigger(folder)
    assert asyncio.run(_events(t, timeout=0.2)) == []
    folder.mkdir()
    (folder / "x-2024-05-06.csv").write_bytes(b"x")
    assert [e["day"] for e in asyncio.run(_events(t))] == ["2024-05-06"]


def test_prefix_outside_the_allowed_roots_is_refused(tmp_path, monkeypatch):
    from house.config import ConfigError
    from house.watch import check_prefix, export_asset

    with pytest.raises(ConfigError, match=r"HOUSE_SACCT_EXPORT_URI='file:///etc/x': outside the allowed input roots"):
        check_prefix("file:///etc/x", [str(tmp_path)])
    with pytest.raises(ConfigError, match="outside the allowed input roots"):
        check_prefix("s3://other/x", ["s3://bucket/traces"])
    assert check_prefix("s3://bucket/traces/ls6/", ["s3://bucket/traces"]) == "s3://bucket/traces/ls6"
    with pytest.raises(ConfigError, match="'..'"):
        check_prefix(f"{tmp_path}/../x", [str(tmp_path)])
    # the trigger checks again where it runs
    t = _trigger(tmp_path / "exports")
    t.roots = ["/nowhere"]
    with pytest.raises(ConfigError, match="outside the allowed input roots"):
        asyncio.run(_events(t))
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path / "storage"))
    monkeypatch.setenv("HOUSE_INPUT_ROOTS", str(tmp_path / "traces"))
    monkeypatch.setenv("HOUSE_SACCT_EXPORT_URI", str(tmp_path / "exports"))
    with pytest.raises(ConfigError, match="HOUSE_SACCT_EXPORT_URI"):
        export_asset()


def test_opt_in_by_setting(tmp_path, monkeypatch):
    """Unset: the daily partitioned cron alone (today's behaviour). Set: the cron or a new export,
    the watched asset carrying the trigger as the triggerer gets it (serialized)."""
    from airflow.sdk import CronPartitionTimetable
    from airflow.serialization.serialized_objects import DagSerialization

    monkeypatch.delenv("HOUSE_SACCT_EXPORT_URI", raising=False)
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path / "storage"))
    assert isinstance(load_dag("mirage_samples").timetable, CronPartitionTimetable)

    monkeypatch.setenv("HOUSE_INPUT_ROOTS", str(tmp_path))
    monkeypatch.setenv("HOUSE_SACCT_EXPORT_URI", f"file://{tmp_path}/exports/")
    monkeypatch.setenv("HOUSE_SACCT_EXPORT_POLL", "5")
    dag = load_dag("mirage_samples")
    ser = DagSerialization.to_dict(dag)["dag"]
    timetable = ser["timetable"]["__var"]
    assert timetable["timetable"]["__type"].endswith("CronPartitionTimetable")  # backfills keep their days
    asset = timetable["asset_condition"]
    assert asset["name"] == "sacct_exports"
    assert asset["uri"] == f"file://{tmp_path}/exports"
    [watcher] = asset["watchers"]
    assert watcher["trigger"]["classpath"] == "house.watch.SacctExportTrigger"
    assert watcher["trigger"]["kwargs"]["prefix"] == f"file://{tmp_path}/exports"
    assert watcher["trigger"]["kwargs"]["poll_interval"] == 5.0
    monkeypatch.setenv("HOUSE_SACCT_EXPORT_POLL", "soon")
    from airflow.dag_processing.dagbag import DagBag
    from conftest import DAGS

    bag = DagBag(dag_folder=str(DAGS / "mirage_samples.py"))
    [error] = bag.import_errors.values()
    assert "HOUSE_SACCT_EXPORT_POLL='soon': expected seconds" in error


def test_triggered_run_reads_its_day_from_the_event():
    """``export_events``: the payloads of this asset's events (the triggerer's extra), oldest day first."""
    from types import SimpleNamespace

    from airflow.sdk import Asset

    from house.watch import export_events

    exports, other = Asset(name="sacct_exports", uri="file:///x"), Asset(name="other", uri="file:///y")
    ev = lambda payload: SimpleNamespace(extra={"from_trigger": True, "payload": payload})  # noqa: E731
    events = {
        exports: [
            ev({"uri": "file:///x/b-2023-01-02", "day": "2023-01-02", "name": "b"}),
            ev({"uri": "file:///x/a-2023-01-01", "day": "2023-01-01", "name": "a"}),
        ],
        other: [ev({"uri": "file:///y/z", "day": "2023-01-05"})],
    }
    assert [e["day"] for e in export_events({"triggering_asset_events": events})] == ["2023-01-01", "2023-01-02"]
    assert export_events({}) == []


def test_the_export_name_rule_is_the_ingests():
    """The watcher announces exactly the files ``ingest`` reads from the folder (two copies of one
    rule: the plugins never import the task packages)."""
    from house import watch
    from mirage_tasks.data import exports

    assert watch.DAY.pattern == exports.DAY.pattern and watch.IGNORED.pattern == exports.IGNORED.pattern
    for name in ("ls6-2023-01-31.log.gz", "ls6-latest.log", "x-2023-02-30.csv", "_SUCCESS.json", "a-2023-01-01.part"):
        ignored = bool(watch.IGNORED.search(name))
        assert ignored == bool(exports.IGNORED.search(name))
        if not ignored:
            try:
                day = watch.export_day(name)
            except ValueError as exc:
                with pytest.raises(ValueError, match=re.escape(str(exc))):
                    exports.export_day(name)
            else:
                assert exports.export_day(name) == day


class _Outlet:
    """``outlet_events[asset]`` as ``publish`` uses it: the extra and the partition keys it adds."""

    def __init__(self):
        self.extra, self.partitions = None, []

    def add_partitions(self, keys):
        self.partitions += [keys] if isinstance(keys, str) else list(keys)


def _samples_day(dag, params: dict, run_type: str, day: str, payload: dict | list | None = None) -> dict:
    """``mirage_samples``' own ``plan`` and ``day_plan`` tasks for one run (no database): a run
    started by ``payload``'s export (or a list of exports that landed together), else a backfill of ``day``."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from airflow.sdk import Asset

    when = datetime.fromisoformat(day).replace(tzinfo=UTC)
    events = {}
    if payload is not None:
        payloads = payload if isinstance(payload, list) else [payload]
        events = {
            Asset(name="sacct_exports", uri="file:///x"): [SimpleNamespace(extra={"payload": p}) for p in payloads]
        }
    ctx = {
        "params": params,
        "dag_run": SimpleNamespace(run_type=run_type, partition_date=None if payload else when, run_after=when),
        "logical_date": None,
        "triggering_asset_events": events,
    }
    p = dag.get_task("plan").python_callable(**ctx)
    return dag.get_task("day_plan").python_callable(p, params=params)


def _commit(partition: str) -> None:
    """A day partition committed (the ``sample`` task's marker, through stepkit)."""
    from stepkit import Step

    step = Step("sample", partition, "test", {"day": partition.rsplit("=", 1)[-1]})
    step.write_json("samples.json", {})
    step.commit()


def test_a_month_of_watched_days_is_one_pipeline_run_on_the_folder(tmp_path, monkeypatch):
    """The exports of February and early March dropped in the watched folder one by one: each
    run samples the day its export completes (six days before it: a day and the five-day
    workload) with the folder as its trace, so the days share one family per node size and their events one trace;
    mirage_monthly's month task then starts one mirage_pipeline run whose trace is the folder and
    whose plan reads exactly those partitions. A backfill of the same days skips them all, and a
    day committed earlier from one export file as the trace (its own family) is left as it was."""
    import copy
    import json
    from datetime import UTC, date, datetime, timedelta
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from mirage_tasks.run.plan import plan_run
    from mirage_tasks.run.runconf import MirageRun
    from stepkit.step import read_marker

    site, storage = tmp_path / "site", tmp_path / "storage"
    folder = site / "exports"
    folder.mkdir(parents=True)
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(storage))
    monkeypatch.setenv("HOUSE_INPUT_ROOTS", str(site))
    monkeypatch.delenv("HOUSE_SACCT_EXPORT_URI", raising=False)
    samples, monthly = load_dag("mirage_samples"), load_dag("mirage_monthly")
    params = dict(samples.params.validate(), trace_timezone="America/Chicago", node_sizes=[1, 8])
    uri = f"file://{folder}"
    days = [f"2023-02-{d:02d}" for d in range(1, 29)]

    # the layout before: Feb 1 sampled with its export file as the trace (a manual run's conf)
    (folder / "ls6-2023-02-01.log").write_text("JobID|Submit|NNodes\n1|2023-02-01T01:00:00|1\n")
    single = _samples_day(samples, dict(params, trace=f"{uri}/ls6-2023-02-01.log"), "manual", "2023-02-01")
    single_parts = single["partitions"]["2023-02-01"]
    for part in single_parts.values():
        _commit(part)
    before = {n: read_marker(p) for n, p in single_parts.items()}

    def export(day: str) -> dict:
        """The site drops ``day``'s export into the folder: the watcher's payload for it."""
        name = f"ls6-{day}.log"
        (folder / name).write_text(f"JobID|Submit|NNodes\n{day[-2:]}{day[5:7]}|{day}T01:00:00|1\n")
        return {"uri": f"{uri}/{name}", "day": day, "name": name, "timezone": "America/Chicago"}

    # the first exports complete days before the folder's first: those runs sample nothing
    for day in days[1:6]:
        with pytest.raises(
            AirflowSkipException, match=rf"ls6-{day}.log completes .*, before the folder's first export \(2023-02-01\)"
        ):
            _samples_day(samples, params, "asset_triggered", day, export(day))
    [asset] = samples.get_task("publish").outlets
    extras = []
    # the export of Feb 7 completes Feb 1 (its samples' jobs: submitted before Feb 7, UTC), ..., Mar 6 Feb 28
    arrivals = [(date.fromisoformat(d) + timedelta(days=6)).isoformat() for d in days]
    for day, arrival in zip(days, arrivals):
        d = _samples_day(samples, params, "asset_triggered", arrival, export(arrival))
        # the earlier days the folder's exports complete are committed: this run's day alone
        assert d["days"] == [day] and d["missing"] == {day: [1, 8]}
        for part in d["partitions"][day].values():
            _commit(part)
        outlet = _Outlet()
        samples.get_task("publish").python_callable(d, params=params, outlet_events={asset: outlet})
        assert outlet.partitions == [f"{day}T00:00:00"] and outlet.extra["params"]["trace"] == uri
        extras.append(json.loads(json.dumps(outlet.extra)))
    families = {
        n: {p.rsplit("/", 1)[0] for p in (e["days"][d]["partitions"][n] for e in extras for d in e["days"])}
        for n in ("1", "8")
    }
    assert all(len(f) == 1 for f in families.values())  # one family per node size for the month

    # the per-file partition of Feb 1 is another family, untouched
    assert set(single_parts.values()).isdisjoint(extras[0]["days"]["2023-02-01"]["partitions"].values())
    assert {n: read_marker(p) for n, p in single_parts.items()} == before

    # a backfill of the same days (the folder as its trace) finds them committed: nothing to sample
    for day in (days[0], days[13], days[-1]):
        assert _samples_day(samples, dict(params, trace=uri), "backfill", day)["missing"] == {day: []}

    # mirage_monthly: one pipeline run for February, on the folder
    events = {asset: [SimpleNamespace(extra=e) for e in extras]}
    run = monthly.get_task("month").python_callable(
        dag_run=SimpleNamespace(partition_key="2023-02"), triggering_asset_events=events
    )
    assert run["run_id"] == "samples_complete__2023-02" and run["conf"]["trace"] == uri
    form = copy.deepcopy(load_dag("mirage_pipeline").params)
    for k, v in run["conf"].items():
        form[k] = v
    pipeline = MirageRun.from_params(form.validate())
    p = plan_run(pipeline, str(storage / "mirage"), str(storage / "mirage_pipeline"), datetime(2023, 3, 1, tzinfo=UTC))
    # the sample families it reads (the months before February train it) are the watched days'
    assert {n: {f} for n, f in p["families"].items()} == families
    assert p["trace_argv"][p["trace_argv"].index("--trace") + 1] == uri

    # a month whose first day came from the export file (the layout before) names two traces: refused
    single_extra = dict(extras[0], params=dict(extras[0]["params"], trace=f"{uri}/ls6-2023-02-01.log"))

    mixed = {asset: [SimpleNamespace(extra=e) for e in [single_extra, *extras[1:]]]}
    with pytest.raises(AirflowFailException, match="different param sets"):
        monthly.get_task("month").python_callable(
            dag_run=SimpleNamespace(partition_key="2023-02"), triggering_asset_events=mixed
        )


def test_exports_reaching_one_run_get_every_day_they_complete_sampled_and_published(tmp_path, monkeypatch):
    """Several exports that reached one run (the scheduler coalesced their events): the run
    samples the day each completes, skipping the committed node sizes, and ``publish`` emits one
    event per day (its partition key the day). A day the folder's exports complete whose export's
    event reached no run (the scheduler leaves events that came while the DAG was at
    ``max_active_runs`` to the next export's run) is caught up when not committed, left out when
    it is; a run whose days are all committed and whose events complete none samples nothing."""
    from airflow.sdk.exceptions import AirflowSkipException

    site, storage = tmp_path / "site", tmp_path / "storage"
    folder = site / "exports"
    folder.mkdir(parents=True)
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(storage))
    monkeypatch.setenv("HOUSE_INPUT_ROOTS", str(site))
    monkeypatch.delenv("HOUSE_SACCT_EXPORT_URI", raising=False)
    samples = load_dag("mirage_samples")
    [asset] = samples.get_task("publish").outlets
    params = dict(samples.params.validate(), trace_timezone="America/Chicago", node_sizes=[1, 8])
    uri = f"file://{folder}"

    def export(day: str) -> dict:
        name = f"ls6-{day}.log"
        (folder / name).write_text(f"JobID|Submit|NNodes\n{day[-2:]}|{day}T01:00:00|1\n")
        return {"uri": f"{uri}/{name}", "day": day, "name": name, "timezone": "America/Chicago"}

    payloads = {d: export(f"2023-03-{d:02d}") for d in range(1, 12)}  # complete Feb 23 .. Mar 5
    # one run of the exports of Mar 7, 8 and 9 (Mar 1, 2, 3); Mar 2's node 8 committed already
    d = _samples_day(samples, params, "asset_triggered", "2023-03-07", [payloads[9], payloads[7], payloads[8]])
    assert d["days"][:3] == ["2023-03-01", "2023-03-02", "2023-03-03"]
    # Mar 10's and 11's exports are in the folder too (their events not given to this run): caught up
    assert d["days"] == ["2023-03-01", "2023-03-02", "2023-03-03", "2023-03-04", "2023-03-05"]
    _commit(d["partitions"]["2023-03-02"]["8"])
    d = _samples_day(samples, params, "asset_triggered", "2023-03-07", [payloads[9], payloads[7], payloads[8]])
    assert d["missing"]["2023-03-02"] == [1] and d["missing"]["2023-03-01"] == [1, 8]
    labels = d["labels"]["sample"]
    assert len(labels) == len(d["sample"]) == 9 and "node 8 · 2023-03-02" not in labels
    assert {f"node {n} · 2023-03-0{i}" for n in (1, 8) for i in (1, 3, 4, 5)} | {"node 1 · 2023-03-02"} == set(labels)
    # publish refuses days whose partitions are not committed, then emits one event per day
    outlet = _Outlet()
    with pytest.raises(RuntimeError, match="partitions not committed"):
        samples.get_task("publish").python_callable(d, params=params, outlet_events={asset: outlet})
    for parts in d["partitions"].values():
        for part in parts.values():
            _commit(part)
    samples.get_task("publish").python_callable(d, params=params, outlet_events={asset: outlet})
    assert sorted(outlet.partitions) == [f"2023-03-0{i}T00:00:00" for i in range(1, 6)]
    assert set(outlet.extra["days"]) == {f"2023-03-0{i}" for i in range(1, 6)}
    assert outlet.extra["days"]["2023-03-02"]["computed"] == [1] and outlet.extra["params"]["trace"] == uri
    assert outlet.extra["days"]["2023-03-02"]["partitions"] == d["partitions"]["2023-03-02"]

    # a later run of Mar 10's export (its event left to it): its day published again, nothing to sample
    again = _samples_day(samples, params, "asset_triggered", "2023-03-10", payloads[10])
    assert again["days"] == ["2023-03-04"] and again["sample"] == [] and again["missing"] == {"2023-03-04": []}
    # a run of only early exports once every day is committed: nothing to sample, nothing published
    with pytest.raises(AirflowSkipException, match="every day the folder's exports complete is committed"):
        _samples_day(samples, params, "asset_triggered", "2023-03-01", payloads[1])
