"""A throw-away PostgreSQL cluster for the tests that run Airflow's services (its scheduler, api-server
and triggerer need a real database: SQLite is for ``airflow dags test`` alone)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin() -> Path | None:
    for cand in [os.environ.get("PGBIN"), *sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)]:
        if cand and (Path(cand) / "pg_ctl").exists() and (Path(cand) / "initdb").exists():
            return Path(cand)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found and (Path(found).parent / "initdb").exists() else None


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, its commands run as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def postgres():
    """A PostgreSQL cluster in a fresh folder on a free 127.0.0.1 port; yields its SQLAlchemy URL."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL not installed (make system-deps installs Debian's postgresql)")
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run PostgreSQL as")
    root = Path(tempfile.mkdtemp(prefix="airflow-pg-"))  # outside pytest's root-only tmp folders
    if os.geteuid() == 0:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, sock, port = root / "data", root / "run", _free_port()
    run = dict(check=True, capture_output=True, text=True, timeout=120)
    try:
        subprocess.run(_as_postgres([str(pg / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]), **run)
        sock.mkdir()
        if os.geteuid() == 0:
            os.chown(sock, owner.pw_uid, owner.pw_gid)
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off"
        subprocess.run(
            _as_postgres(
                [str(pg / "pg_ctl"), "-D", str(data), "-l", str(root / "pg.log"), "-w", "-t", "60", "-o", opts, "start"]
            ),
            **run,
        )
        try:
            yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(_as_postgres([str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]), **run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
