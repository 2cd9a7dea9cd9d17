"""A real Airflow for end-to-end tests: a throw-away PostgreSQL cluster, the services started in
process groups of their own, their health awaited, and everything stopped at the end
(:func:`real_airflow`: all of it around one real DAG file)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "ui"))
from airflow_ui import PASSWORD, USER, airflow_env, api_send, api_token, free_port
from pgcluster import postgres

T = TypeVar("T")


def stop_group(pid: int) -> None:
    """SIGTERM the process group ``pid``, SIGKILL what is left after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def tail(path: Path, n: int = 3000) -> str:
    return f"--- {path.name} ---\n" + (path.read_text(errors="replace")[-n:] if path.exists() else "(none)")


def wait_up(base: str, procs: dict[str, subprocess.Popen], logs: dict[str, Path]) -> None:
    end = time.monotonic() + 180
    while True:
        dead = [n for n, p in procs.items() if p.poll() is not None]
        if dead:
            pytest.fail(f"{', '.join(dead)} exited\n" + "\n".join(tail(logs[n]) for n in dead))
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2) as r:
                health = json.load(r)
                if all(health.get(k, {}).get("status") == "healthy" for k in ("scheduler", "triggerer")):
                    return
        if time.monotonic() > end:
            pytest.fail("Airflow not healthy in 180 s\n" + "\n".join(tail(p) for p in logs.values()))
        time.sleep(1)


#: the services an end-to-end run starts: the REST API and UI, the scheduler and the triggerer
SERVICES = ("api-server", "scheduler", "triggerer")


def start_services(airflow: list[str], env: dict[str, str], home: Path, port: int, procs: dict, logs: dict) -> None:
    """Start :data:`SERVICES` (each in its own process group, its log in ``home``), recorded in
    ``procs`` and ``logs`` for the caller to stop, and wait until the API says they are healthy."""
    for name in SERVICES:
        args = {"api-server": ["-H", "127.0.0.1", "-p", str(port), "--workers", "1"]}.get(name, ["--skip-serve-logs"])
        logs[name] = home / f"{name}.log"
        with open(logs[name], "wb") as out:
            procs[name] = subprocess.Popen(
                [*airflow, name, *args], env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
    wait_up(f"http://127.0.0.1:{port}", procs, logs)


class RealAirflow:
    """What :func:`real_airflow` started: its folders, environment, services and their logs."""

    def __init__(self, tmp_path: Path, env: dict[str, str], port: int):
        self.home, self.storage, self.dags = tmp_path / "home", tmp_path / "storage", tmp_path / "dags"
        self.env, self.base = env, f"http://127.0.0.1:{port}"
        self.airflow = [sys.executable, "-m", "airflow"]
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self._token: str | None = None

    def cli(self, *argv: str) -> str:
        """``airflow <argv>`` in this deployment's environment; its stdout (fails the test on an error)."""
        p = subprocess.run(
            [*self.airflow, *argv], env=self.env, cwd=self.home, capture_output=True, text=True, timeout=240
        )
        assert p.returncode == 0, f"airflow {' '.join(argv)}: {p.stderr[-3000:]}"
        return p.stdout

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        """A REST API call (``GET``, ``PATCH`` ...) as the test user; the JSON answer."""
        if self._token is None:
            self._token = api_token(self.base)
        return api_send(self.base, self._token, method, path, body)

    def fail(self, why: str) -> NoReturn:
        pytest.fail(why + "\n" + "\n".join(tail(p) for p in self.logs.values()))

    def wait(self, what: str, check: Callable[[], T], timeout_s: float) -> T:
        """Poll ``check`` every second until it returns something true (returned); fails the test
        naming ``what`` when a service exits or ``timeout_s`` passes, with the services' log tails."""
        end = time.monotonic() + timeout_s
        while True:
            got = check()
            if got:
                return got
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                self.fail(f"{what}: {', '.join(dead)} exited")
            if time.monotonic() > end:
                self.fail(f"{what}: not in {timeout_s:.0f} s")
            time.sleep(1)


@contextlib.contextmanager
def real_airflow(tmp_path: Path, dag_file: str, env: dict[str, str] | None = None) -> Iterator[RealAirflow]:
    """The real ``dags/<dag_file>``, alone in a dags folder, under a real Airflow: PostgreSQL,
    ``airflow db migrate``, the DAG parsed and unpaused, then :data:`SERVICES` (LocalExecutor, two
    task slots, the steps as local processes) on 127.0.0.1 with ``env`` added to their
    environment (the house settings a deployment gives its workers). Yields the
    :class:`RealAirflow`; its services are stopped at the end, PostgreSQL last."""
    for d in ("home", "storage", "dags"):
        (tmp_path / d).mkdir()
    shutil.copy(REPO / "dags" / dag_file, tmp_path / "dags")
    with postgres() as db_url:
        port = free_port()
        full = airflow_env(tmp_path / "home", tmp_path / "storage", port)
        full.update(
            {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
                "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "2",
                **(env or {}),
            }
        )
        af = RealAirflow(tmp_path, full, port)
        (af.home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))  # the REST API's user
        try:
            af.cli("db", "migrate")
            af.cli("dags", "reserialize")
            af.cli("dags", "unpause", Path(dag_file).stem)
            start_services(af.airflow, af.env, af.home, port, af.procs, af.logs)
            yield af
        finally:
            for name in reversed(list(af.procs)):
                stop_group(af.procs[name].pid)
                af.procs[name].wait(timeout=10)
