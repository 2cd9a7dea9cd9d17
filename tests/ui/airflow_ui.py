"""A real Airflow api-server and a headless Chromium for the browser tests (tests/ui).

:func:`api_server` starts ``airflow api-server`` on a free 127.0.0.1 port (SimpleAuthManager,
one admin user, a throw-away PostgreSQL of its own: SQLite is for ``airflow dags test`` alone, and
under a scheduler it answers "database is locked") with this repository's dags/ and plugins/, optionally parses the DAGs
into its database first (``airflow dags reserialize``), optionally runs ``airflow scheduler``
beside it (LocalExecutor) so that triggered runs run, and stops each one's whole process group
on exit. :func:`chromium` drives Debian's chromium through selenium; :func:`login` signs in
through Airflow's own login form. :func:`missing` says why a browser test must skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgcluster import postgres

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("UI_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("UI_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
USER, PASSWORD = "tester", "pw-for-the-ui-test"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
]


def missing() -> str | None:
    """Why a browser test cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"chromium not installed ({CHROMIUM}); apt-get install -y chromium chromium-driver (make system-deps)"
    if not os.access(CHROMEDRIVER, os.X_OK):
        return f"chromedriver not installed ({CHROMEDRIVER}); apt-get install -y chromium-driver (make system-deps)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -r requirements-dev.txt -c constraints.txt)"
    return None


def browser_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A browser test's Airflow home and storage root (fresh folders), or a skip saying why the
    test cannot run here."""
    why = missing()
    if why:
        pytest.skip(why)
    return tmp_path_factory.mktemp("airflow-home"), tmp_path_factory.mktemp("storage")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def airflow_env(home: Path, storage: Path, port: int) -> dict[str, str]:
    """The environment of an Airflow on ``home`` serving 127.0.0.1:``port``; its database is SQLite
    (what ``airflow dags test`` needs) unless the caller sets ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``
    (:func:`api_server` sets a PostgreSQL's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "HOUSE_"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "ui-test-secret-" + os.urandom(8).hex(),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "HOUSE_STORAGE_ROOT": str(storage),
            "HOUSE_NO_VARIABLES": "1",
            "HOUSE_RUNNER": "local",
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc``'s process group (it was started in a session of its own), SIGKILL it after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def api_server(
    home: Path, storage: Path, *, dags: bool = False, scheduler: bool = False, env: dict[str, str] | None = None
) -> Iterator[dict]:
    """:func:`_api_server` on a PostgreSQL cluster of its own, stopped after the services."""
    with postgres() as db:
        extra = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db, **(env or {})}
        with _api_server(home, storage, dags=dags, scheduler=scheduler, env=extra) as srv:
            yield srv


@contextlib.contextmanager
def _api_server(
    home: Path, storage: Path, *, dags: bool = False, scheduler: bool = False, env: dict[str, str] | None = None
) -> Iterator[dict]:
    """``airflow api-server`` on a fresh database in ``home``; with ``dags`` the DAGs are parsed
    into it first. With ``scheduler`` an ``airflow scheduler`` (LocalExecutor, two task slots)
    runs beside it, so triggered runs really run their tasks (the steps as local processes,
    ``HOUSE_RUNNER=local``); its output goes to ``home/scheduler.log``. ``env`` is added to the
    environment of every Airflow process (what a deployment sets for its workers).
    Yields ``{"base": url, "env": env, "log": path, "airflow": argv prefix}``."""
    port = free_port()
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    extra = env or {}
    env = airflow_env(home, storage, port)
    env.update(extra)
    if scheduler:
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "2",  # a shared 2-core machine
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            }
        )
    airflow = [sys.executable, "-m", "airflow"]
    subprocess.run([*airflow, "db", "migrate"], env=env, cwd=home, check=True, capture_output=True, timeout=300)
    if dags:
        p = subprocess.run(
            [*airflow, "dags", "reserialize"], env=env, cwd=home, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-3000:]
    log_path = home / "api-server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [*airflow, "api-server", "-H", "127.0.0.1", "-p", str(port), "--workers", "1"],
        env=env,
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    sched = sched_log = None
    try:
        if scheduler:
            sched_log = open(home / "scheduler.log", "wb")
            sched = subprocess.Popen(
                [*airflow, "scheduler"],
                env=env,
                cwd=home,
                stdout=sched_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise AssertionError("api-server exited:\n" + log_path.read_text()[-4000:])
            if sched is not None and sched.poll() is not None:
                raise AssertionError("scheduler exited:\n" + (home / "scheduler.log").read_text()[-4000:])
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise AssertionError("api-server not up in 180 s:\n" + log_path.read_text()[-4000:])
            time.sleep(1)
        yield {"base": base, "env": env, "log": log_path, "airflow": airflow, "home": home}
    finally:
        if sched is not None:
            _stop_group(sched)  # first: its task processes report to the api-server
        _stop_group(proc)
        log.close()
        if sched_log is not None:
            sched_log.close()


@contextlib.contextmanager
def chromium(profile: Path):
    """A headless Chromium under selenium (nothing downloaded: Debian's browser and driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager must not download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def login(driver, base: str, path: str = "/") -> None:
    """Open ``path`` and sign in through Airflow's login form when it asks."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base + path)
    # the UI redirects to its login page as it loads: a look at the page while it navigates is
    # "aborted by navigation" (seen on a loaded machine), so those are retried until the form is there
    ignored = (StaleElementReferenceException, WebDriverException)
    user = WebDriverWait(driver, 90, ignored_exceptions=ignored).until(
        EC.visibility_of_element_located((By.NAME, "username"))
    )
    user.send_keys(USER)
    pw = driver.find_element(By.NAME, "password")
    pw.send_keys(PASSWORD)
    pw.send_keys(Keys.ENTER)
    WebDriverWait(driver, 90).until(lambda d: "/auth/login" not in d.current_url)


def api_token(base: str) -> str:
    """A bearer token for the REST API (the same user)."""
    req = urllib.request.Request(
        f"{base}/auth/token",
        data=json.dumps({"username": USER, "password": PASSWORD}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["access_token"]


def api_get(base: str, token: str, path: str) -> dict:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def api_put(base: str, token: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body or {}).encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def api_send(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    """``method`` (POST, PATCH) ``path`` with a JSON body; the JSON answer."""
    req = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body or {}).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from None


def open_trigger_dialog(driver, base: str, dag_id: str):
    """Open ``dag_id``'s page and its trigger dialog, as a user clicks Trigger; returns the dialog."""
    from proctree import wait_for
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/dags/{dag_id}")
    WebDriverWait(driver, 90).until(
        EC.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"))
    ).click()
    return wait_for(  # React may replace the dialog while it opens: looked up again
        lambda: next(
            (d for d in driver.find_elements(By.CSS_SELECTOR, "[role=dialog]") if "Run Parameters" in d.text), None
        ),
        "the trigger dialog",
        retry_on=(StaleElementReferenceException, ElementNotInteractableException, NoSuchElementException),
        poll_s=0.5,
    )
