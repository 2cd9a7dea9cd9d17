"""Start and stop a real local Slurm (munge, one slurmctld, N ``slurmd -N nX``) as root.

``python -m lab.slurm.cluster start|stop|status [--root var/slurm] [--cluster-config
ls6] [--nodes N] [--factor F]`` (``make slurm`` / ``make slurm-stop`` / ``make slurm-status``)
and :class:`LocalSlurm` (the pytest fixture). Everything lives under ``--root``: the munge key
and socket, ``slurm.conf``, state, spool, logs, the job-completion log and one record per
daemon (pid and start time). Ports are free 127.0.0.1 ports found at start, and every daemon
listens on 127.0.0.1 only (checked at start). ``stop`` cancels every job, waits for their steps
to end, then stops each daemon by its record (slurmd, slurmctld, slurmdbd, mariadbd, munged, in
that order) and the job steps found by their sockets in this root's spool folder: exactly what
this root started, never a process that merely carries its ``SLURM_CONF``. ``status`` checks
each daemon the cluster should run and exits 1 naming those that do not. A ``start`` stopped
by SIGTERM, SIGINT or SIGHUP stops what it had started.

With ``--accounting`` (``make slurm SLURM_ACCOUNTING=1``) the cluster keeps accounts: a fresh
MariaDB under ``<root>/mysql`` (127.0.0.1, a free port; root only through its socket, slurmdbd's
own user with a random password kept in the mode-600 ``slurmdbd.conf``), slurmdbd on a free
port, and the association tree of :func:`lab.slurm.slurmconf.associations` (one account per
trace user, ``--users N``; the service; the QOS limits) before slurmctld starts. Slurm then
enforces the age factor, fair share and the per-user and QOS limits the simulator models.

Clients use ``SLURM_CONF=<root>/slurm.conf`` (:meth:`LocalSlurm.env`; ``<root>/env.sh``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab.slurm.slurmconf import Paths, associations, render, render_dbd, scaled, unsupported
from mirage_tasks.sim.config import SimConfig, config_from_args
from stepkit import StepError

log = logging.getLogger(__name__)

DAEMONS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "squeue", "sinfo", "scancel")


def missing_binaries() -> list[str]:
    """Slurm/munge programs this needs that are not on PATH (or /usr/sbin)."""
    out = []
    for b in ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "sinfo", "scancel", "scontrol"):
        if not (shutil.which(b) or os.path.exists(f"/usr/sbin/{b}")):
            out.append(b)
    return out


#: What accounting adds (``--accounting``): Debian's slurmdbd, its sacctmgr, and MariaDB.
ACCOUNTING_BINARIES = ("slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb")


def missing_accounting() -> list[str]:
    """The accounting programs (slurmdbd on a local MariaDB) not on PATH (or /usr/sbin)."""
    return [b for b in ACCOUNTING_BINARIES if not (shutil.which(b) or os.path.exists(f"/usr/sbin/{b}"))]


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _port_free(p: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            return False
    return True


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (ip_local_port_range)."""
    try:
        lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port_range(n: int, lo: int = 20000, hi: int = 60000) -> int:
    """First port of ``n`` consecutive free 127.0.0.1 ports (a random start, then upwards),
    outside the kernel's ephemeral range where that leaves room: a port found free there can be
    taken by any outgoing connection (slurmctld's to slurmdbd, a client's) before its daemon
    binds it."""
    import random

    e_lo, e_hi = ephemeral_ports()
    if e_lo - 1024 > 4 * n + 1:
        lo, hi = max(1024, min(lo, e_lo - 4 * n - 1)), e_lo
    elif 65535 - e_hi > 4 * n + 1:
        lo, hi = e_hi + 1, 65535
    start = random.randrange(lo, hi - n)
    p = start
    while p + n < hi:
        if all(_port_free(q) for q in range(p, p + n)):
            return p
        p += n
    p = lo  # wrap around once
    while p + n < start:
        if all(_port_free(q) for q in range(p, p + n)):
            return p
        p += n
    raise RuntimeError(f"no {n} consecutive free ports in [{lo}, {hi})")


#: One lock per machine over choosing a cluster's port block and starting its daemons: two clusters
#: started at the same instant (lab/campaigns/keeper_campaign.py starts one per window) could otherwise both
#: find the same block free before either had bound it (two of ten did: "Address already in use").
PORT_LOCK = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mirage-slurm-ports.lock")


class port_lock:
    """Held from :func:`free_port_range` until the daemons listen (a blocking ``flock``)."""

    def __init__(self, path: str = PORT_LOCK):
        self.path = path

    def __enter__(self) -> port_lock:
        import fcntl

        self.fh = open(self.path, "a")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): with its pid it
    names one process, so a pid reused after the daemon died is never taken for it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


#: Signals that stop ``make slurm`` midway (make forwards SIGTERM to its command; Ctrl-C sends SIGINT
#: to the foreground group; a closed terminal SIGHUP): held back between starting a daemon and
#: recording it, so no daemon is ever running without its record.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _daemon_preexec(own_hostname: bool):
    """What runs in the child before a daemon's exec: the stop signals unblocked (the mask is
    inherited across exec, and :meth:`LocalSlurm._spawn` blocks them while it records the pid); for
    the Slurm daemons also a UTS namespace of their own whose host name is ``localhost``. Slurm
    22.05 binds its listening sockets to any address unless ``CommunicationParameters`` says
    ``NoCtldInAddrAny,NoInAddrAny``, and then to what the daemon's host name resolves to:
    ``localhost`` resolves to 127.0.0.1 on every machine, the machine's own name need not."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if own_hostname and not _localhost_uts():
            raise OSError("cannot give the daemon the host name localhost (unshare CLONE_NEWUTS)")

    return run


def _localhost_uts() -> bool:
    """Move this process into a UTS namespace of its own named ``localhost`` (needs CAP_SYS_ADMIN)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(0x04000000) == 0 and libc.sethostname(b"localhost", 9) == 0  # CLONE_NEWUTS


def loopback_hostname() -> bool | str:
    """How the Slurm daemons come to bind to 127.0.0.1: True when they can run with the host name
    ``localhost`` (a UTS namespace: root with CAP_SYS_ADMIN, tried in a child), False when they
    need not (this machine's host name resolves to 127.0.0.1 already), else why neither holds."""
    pid = os.fork()
    if pid == 0:  # the child only tries the namespace and exits
        os._exit(0 if _localhost_uts() else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return True
    name = socket.gethostname()
    try:
        addr = socket.gethostbyname(name)
    except OSError as exc:
        addr = str(exc)
    if addr.startswith("127."):
        return False
    return (
        f"the Slurm daemons would listen on {addr} (what the host name {name} resolves to): they cannot "
        "be given the host name localhost here (no CAP_SYS_ADMIN for a UTS namespace); map the host "
        "name to 127.0.0.1 in /etc/hosts, or run with CAP_SYS_ADMIN"
    )


def listening(pid: int) -> list[str]:
    """The TCP addresses ``pid`` listens on (``ip:port``), from its open sockets and /proc/net/tcp{,6}."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) < 10 or f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            out.append(f"{_hex_ip(addr, v6)}:{int(port, 16)}")
    return out


def _hex_ip(h: str, v6: bool) -> str:
    import ipaddress

    raw = bytes.fromhex(h)
    if not v6:
        return str(ipaddress.IPv4Address(raw[::-1]))
    return str(ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))))


class LocalSlurm:
    """One local cluster under ``root``."""

    #: whether the Slurm daemons get a UTS namespace named localhost (:func:`loopback_hostname`)
    _own_uts = True

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.paths = Paths(str(self.root))
        self.info_file = self.root / "cluster.json"

    # ------------------------------------------------------------------ helpers
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.paths.conf}

    def info(self) -> dict:
        return json.loads(self.info_file.read_text()) if self.info_file.exists() else {}

    def cmd(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True, check=check, timeout=timeout)

    def _spawn(self, name: str, argv: list[str], log: Path) -> int:
        """Start one daemon in a session of its own and record it (``pids/NAME.started``: its pid
        and start time), the stop signals held back in between (they act once it is recorded)."""
        (self.root / "pids").mkdir(exist_ok=True)
        record = self.root / "pids" / f"{name}.started"
        fh = open(log, "ab")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            p = subprocess.Popen(
                argv,
                env=self.env(),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(self.root),
                preexec_fn=_daemon_preexec(name.startswith("slurm") and self._own_uts),
            )
            tmp = record.with_suffix(".tmp")
            tmp.write_text(f"{p.pid} {_start_time(p.pid) or ''}".strip())
            os.replace(tmp, record)
        finally:
            fh.close()
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return p.pid

    def _records(self) -> dict[str, tuple[int, int | None]]:
        """What this root started: name -> (pid, start time) from ``pids/*.started``."""
        out = {}
        d = self.root / "pids"
        if d.is_dir():
            for f in d.glob("*.started"):
                try:
                    fields = f.read_text().split()
                    out[f.stem] = (int(fields[0]), int(fields[1]) if len(fields) > 1 else None)
                except (ValueError, IndexError):
                    pass
        return out

    def _pids(self) -> dict[str, int]:
        return {k: v[0] for k, v in self._records().items()}

    @staticmethod
    def _is(pid: int, started: int | None) -> bool:
        """``pid`` is alive and is still the process that was recorded (same start time)."""
        return _alive(pid) and (started is None or _start_time(pid) == started)

    def running(self) -> dict[str, int]:
        """The recorded daemons that still run (the recorded process itself, not a reused pid)."""
        return {k: pid for k, (pid, t) in self._records().items() if self._is(pid, t)}

    # ------------------------------------------------------------------ start
    def start(
        self,
        cfg: SimConfig,
        factor: float = 1.0,
        timeout: float = 90,
        accounting: bool = False,
        users: int = 0,
        unknown: bool = False,
        debug_flags: str = "",
    ) -> dict:
        """Start the cluster; with ``accounting`` also a MariaDB and slurmdbd under the root, with the
        association tree of :func:`~.conf.associations` for ``users`` trace users (ids 0..users-1;
        ``unknown``: and jobs without one) built before slurmctld starts. ``debug_flags``:
        slurmctld's ``DebugFlags`` (its log, ``log/slurmctld.log``, then says why)."""
        if os.geteuid() != 0:
            raise RuntimeError("the local Slurm runs its daemons as root (SlurmUser=root); run as root")
        miss = missing_binaries()
        if miss:
            raise RuntimeError(
                f"not installed: {', '.join(miss)} (make system-deps installs Debian's slurmctld, "
                "slurmd, slurm-client and munge)"
            )
        if accounting and missing_accounting():
            raise RuntimeError(
                f"accounting: not installed: {', '.join(missing_accounting())} (make system-deps "
                "installs Debian's slurmdbd and mariadb-server)"
            )
        if self.running():
            raise RuntimeError(f"a local Slurm already runs under {self.root} ({self.running()}): stop it first")
        own_uts = loopback_hostname()
        if isinstance(own_uts, str):
            raise RuntimeError(own_uts)
        self._own_uts = own_uts
        p = self.paths
        for d in (p.munge_dir, p.state, p.spool, p.logs, p.pids):
            os.makedirs(d, exist_ok=True)
        os.chmod(p.munge_dir, 0o700)
        os.makedirs(os.path.dirname(p.munge_socket), exist_ok=True)
        os.chmod(os.path.dirname(p.munge_socket), 0o755)
        shutil.rmtree(p.db_dir, ignore_errors=True)  # and no usage or associations from one
        for old in (Path(p.state), Path(p.spool)):  # a fresh cluster: no jobs from an earlier run
            shutil.rmtree(old, ignore_errors=True)
            old.mkdir()
        for f in Path(p.pids).glob("*"):
            f.unlink()
        Path(p.jobcomp).unlink(missing_ok=True)
        n = int(cfg.nodes)
        if not os.path.exists(p.munge_key):
            subprocess.run([_bin("mungekey"), "--create", f"--keyfile={p.munge_key}"], check=True, capture_output=True)
        os.chmod(p.munge_key, 0o600)
        # slurmctld, the n slurmd (and MariaDB, slurmdbd) on consecutive ports outside the ephemeral range,
        # chosen and bound under the machine's port lock (released once every daemon listens)
        with port_lock():
            return self._start_daemons(cfg, factor, timeout, accounting, users, unknown, debug_flags, n)

    def _start_daemons(
        self,
        cfg: SimConfig,
        factor: float,
        timeout: float,
        accounting: bool,
        users: int,
        unknown: bool,
        debug_flags: str,
        n: int,
    ) -> dict:
        p = self.paths
        base = free_port_range(n + 3)
        ctld, first = base, base + 1
        db_port = dbd_port = None
        if accounting:
            db_port, dbd_port = base + n + 1, base + n + 2
        (self.root / "slurm.conf").write_text(
            render(cfg, factor, p, ctld, (first, first + n - 1), dbd_port=dbd_port, debug_flags=debug_flags)
        )
        for i in range(1, n + 1):
            os.makedirs(f"{p.spool}/n{i}", exist_ok=True)
        (self.root / "env.sh").write_text(f"# written by lab.slurm.cluster start\nexport SLURM_CONF={p.conf}\n")
        info = {
            "root": str(self.root),
            "nodes": n,
            "factor": factor,
            "ctld_port": ctld,
            "node_ports": [first, first + n - 1],
            "config": cfg.to_dict(),
            "scaled": scaled(cfg, factor),
            "unsupported": unsupported(cfg, accounting),
            "started_at": time.time(),
            "accounting": {"db_port": db_port, "dbd_port": dbd_port, "users": int(users), "unknown": bool(unknown)}
            if accounting
            else None,
        }
        self.info_file.write_text(json.dumps(info, indent=1))
        try:
            self._spawn(
                "munged",
                [
                    _bin("munged"),
                    "-F",
                    "--force",
                    f"--socket={p.munge_socket}",
                    f"--key-file={p.munge_key}",
                    f"--pid-file={p.munge_dir}/munged.pid",
                    f"--log-file={p.logs}/munged.log",
                    f"--seed-file={p.munge_dir}/munged.seed",
                ],
                Path(p.logs) / "munged.out",
            )
            self._wait(lambda: os.path.exists(p.munge_socket), 20, "munged socket", "munged.log")
            if accounting:
                self._start_accounting(cfg, int(users), unknown, db_port, dbd_port, timeout)
            self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-i", "-f", p.conf], Path(p.logs) / "slurmctld.out")
            self._wait(
                lambda: self.cmd("scontrol", "ping", check=False, timeout=10).stdout.count("UP") > 0,
                timeout,
                "slurmctld to answer",
                "slurmctld.log",
            )
            for i in range(1, n + 1):
                self._spawn(
                    f"slurmd-n{i}",
                    [_bin("slurmd"), "-D", "-N", f"n{i}", "-f", p.conf],
                    Path(p.logs) / f"slurmd-n{i}.out",
                )
            self._wait(lambda: self.idle_nodes() >= n, timeout, f"{n} idle nodes", "slurmctld.log")
            self._check_loopback()
        except BaseException:  # a failed start, and a stopped one (SIGTERM, Ctrl-C): nothing is left running
            self.stop()
            raise
        return info

    def _check_loopback(self) -> None:
        """Every daemon listens on 127.0.0.1 only (the cluster runs jobs as root for anyone who
        can reach it): a start where one listens elsewhere fails, naming it."""
        wrong = [
            f"{name} on {a}"
            for name, pid in sorted(self.running().items())
            for a in listening(pid)
            if not a.startswith("127.0.0.1:")
        ]
        if wrong:
            raise RuntimeError(f"listening beyond 127.0.0.1: {', '.join(wrong)}")

    def _start_accounting(
        self, cfg: SimConfig, users: int, unknown: bool, db_port: int, dbd_port: int, timeout: float
    ) -> None:
        """A fresh MariaDB (root only through its socket; slurmdbd's own user with a random
        password over 127.0.0.1), slurmdbd, then the cluster, QOS and associations."""
        import secrets

        p = self.paths
        r = subprocess.run(
            [
                _bin("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={p.db_dir}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode:
            raise RuntimeError(f"mariadb-install-db failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        self._spawn(
            "mariadbd",
            [
                _bin("mariadbd"),
                "--no-defaults",
                f"--datadir={p.db_dir}",
                f"--socket={p.db_socket}",
                f"--port={db_port}",
                "--bind-address=127.0.0.1",
                "--user=root",
                f"--pid-file={p.pids}/mariadbd.pid",
                f"--log-error={p.logs}/mariadb.err",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
                "--innodb-lock-wait-timeout=900",
                "--max-connections=50",
            ],
            Path(p.logs) / "mariadbd.out",
        )
        sql = [_bin("mariadb"), "--no-defaults", f"--socket={p.db_socket}", "-u", "root", "-e"]
        self._wait(
            lambda: subprocess.run(sql + ["SELECT 1"], capture_output=True, timeout=10).returncode == 0,
            timeout,
            "MariaDB to answer",
            "mariadb.err",
        )
        password = secrets.token_hex(16)
        r = subprocess.run(
            sql
            + [
                f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode:
            raise RuntimeError(f"MariaDB: could not create slurmdbd's user: {r.stderr.strip()}")
        fd = os.open(p.dbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:  # slurmdbd refuses a readable one (it holds the password)
            fh.write(render_dbd(p, dbd_port, db_port, password))
        os.chmod(p.dbd_conf, 0o600)
        self._spawn("slurmdbd", [_bin("slurmdbd"), "-D"], Path(p.logs) / "slurmdbd.out")
        self._wait(
            lambda: self.cmd("sacctmgr", "-n", "-P", "list", "cluster", check=False, timeout=10).returncode == 0,
            timeout,
            "slurmdbd to answer",
            "slurmdbd.log",
        )
        for args in associations(cfg, users, unknown):
            r = self.cmd("sacctmgr", "-i", *args, check=False, timeout=120)
            if r.returncode:
                raise RuntimeError(
                    f"sacctmgr {' '.join(args)[:200]} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-600:]}"
                )

    def _wait(self, cond, timeout: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [k for k, (pid, t) in self._records().items() if not self._is(pid, t)]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; see {self.paths.logs}/{log}")
            try:
                if cond():
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            time.sleep(0.3)
        tail = ""
        f = Path(self.paths.logs) / log
        if f.exists():
            tail = "\n".join(f.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}; {f}:\n{tail}")

    def expected(self) -> list[str]:
        """The daemons a started cluster of this root runs (``cluster.json``): munged, slurmctld,
        one slurmd per node, and with accounting mariadbd and slurmdbd."""
        info = self.info()
        if not info:
            return []
        names = ["munged"] + (["mariadbd", "slurmdbd"] if info.get("accounting") else []) + ["slurmctld"]
        return names + [f"slurmd-n{i}" for i in range(1, int(info.get("nodes", 0)) + 1)]

    def status(self) -> tuple[list[str], list[str]]:
        """One line per daemon the cluster should run, and the names of those that do not (or run
        but do not answer): each recorded process must still be the one started; slurmctld must
        answer ``scontrol ping``, no node may be down or unresponsive in ``sinfo`` (drained is fine),
        MariaDB must answer through its socket and slurmdbd through ``sacctmgr``."""
        want = self.expected()
        records, run = self._records(), self.running()
        lines, bad = [], []
        for name in want + sorted(set(records) - set(want)):
            if name in run:
                lines.append(f"{name}: running (pid {run[name]})")
            else:
                bad.append(name)
                lines.append(
                    f"{name}: DEAD (pid {records[name][0]} is gone)"
                    if name in records
                    else f"{name}: DEAD (never started, or stopped: no record under {self.paths.pids})"
                )

        def answers(*argv: str, timeout: float = 10) -> tuple[bool, str]:
            try:
                r = subprocess.run(
                    list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
                )
            except (subprocess.SubprocessError, OSError) as exc:
                return False, str(exc)
            return r.returncode == 0, (r.stdout + r.stderr).strip()

        def not_answering(name: str, why: str) -> None:
            bad.append(name)
            lines.append(f"{name}: NOT ANSWERING (pid {run[name]} runs: {why[-200:]})")

        if "slurmctld" in run:
            ok, out = answers("scontrol", "ping")
            if not ok or "UP" not in out:
                not_answering("slurmctld", out)
            else:
                ok, out = answers("sinfo", "-h", "-N", "-o", "%N %t")
                for ln in out.splitlines() if ok else []:
                    node, state = (ln.split() + ["", ""])[:2]
                    # "*": not responding; a drained node is an operator's choice (keep-service's late nodes)
                    if f"slurmd-{node}" in run and (state.endswith("*") or state.startswith(("down", "fail"))):
                        not_answering(f"slurmd-{node}", f"slurmctld reports the node {state}")
        if "mariadbd" in run:
            ok, out = answers(
                _bin("mariadb"), "--no-defaults", f"--socket={self.paths.db_socket}", "-u", "root", "-e", "SELECT 1"
            )
            if not ok:
                not_answering("mariadbd", out)
        if "slurmdbd" in run and "mariadbd" not in bad:
            ok, out = answers("sacctmgr", "-n", "-P", "list", "cluster", timeout=20)
            if not ok:
                not_answering("slurmdbd", out)
        return lines, bad

    def idle_nodes(self) -> int:
        r = self.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
        return sum(1 for ln in r.stdout.splitlines() if ln.split()[-1:] == ["idle"])

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 60) -> list[str]:
        """Cancel every job, stop each daemon this root started; returns what was stopped."""
        said = []
        pids = self.running()
        if "slurmctld" in pids and "munged" in pids:  # without munged no client can reach slurmctld
            deadline = time.monotonic() + timeout / 2
            try:  # a slurmctld that does not answer must not keep its daemons alive: they are killed below
                r = self.cmd("scancel", "--full", "--user=root", check=False, timeout=max(1.0, timeout / 2))
                said.append(f"cancelled every job (scancel status {r.returncode})")
                while time.monotonic() < deadline:
                    r = self.cmd(
                        "squeue",
                        "-h",
                        "-o",
                        "%i",
                        check=False,
                        timeout=max(1.0, min(10.0, deadline - time.monotonic())),
                    )
                    if r.returncode == 0 and not r.stdout.strip():
                        break
                    time.sleep(0.5)
            except (subprocess.SubprocessError, OSError) as exc:
                said.append(f"could not cancel the jobs through slurmctld ({exc}); stopping the daemons")
        # the job steps as their slurmd leaves them (found again after it stops: it may start one meanwhile)
        steps = {p: _start_time(p) for p in self.leftovers()}
        order = sorted((k for k in pids if k.startswith("slurmd-")), key=lambda k: int(k.split("-n")[1]))
        order += [k for k in ("slurmctld", "slurmdbd", "mariadbd", "munged") if k in pids]
        for name in order:
            pid = pids[name]
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + timeout / 2
        for name in order:
            pid = pids[name]
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            said.append(f"stopped {name} (pid {pid})")
        # job steps that outlived their slurmd (slurmstepd runs in a session of its own)
        steps.update((p, _start_time(p)) for p in self.leftovers())
        killed = {}
        for pid, started in sorted(steps.items()):
            if not self._is(pid, started):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                said.append(f"killed leftover job process {pid}")
                killed[pid] = started
            except ProcessLookupError:
                pass
        # a SIGKILL is delivered when the process next runs: on a loaded machine it may still be
        # there a moment later, and a caller that looks again at once would call it left over
        deadline = time.monotonic() + 10.0
        while any(self._is(p, t) for p, t in killed.items()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for f in Path(self.paths.pids).glob("*.started") if os.path.isdir(self.paths.pids) else []:
            f.unlink()
        return said

    def leftovers(self) -> list[int]:
        """The job steps this root's slurmd started that still run, found from this root's own
        records, never from what a process merely carries: each ``slurmstepd`` holds its step's
        socket in this root's spool folder (``spool/NODE/NODE_JOB.STEP``); its tasks run in its
        session; a task that left that session still has this root's ``SLURM_CONF`` together
        with the ``SLURMD_NODENAME`` only a slurmstepd sets. A shell that sourced ``env.sh``, and
        every program it starts (``make``, ``tail -f`` of a log here), has the first and not the
        second: it is left alone."""
        spool = self.paths.spool.rstrip("/") + "/"
        inodes = set()
        try:
            with open("/proc/net/unix") as fh:
                rows = fh.read().splitlines()[1:]
            for row in rows:
                f = row.split()
                if len(f) >= 8 and f[7].startswith(spool):
                    inodes.add(f[6])
        except OSError:
            pass
        conf = b"SLURM_CONF=" + self.paths.conf.encode()
        me = os.getpid()
        stepds, sessions, tasks = set(), {}, set()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            pid = int(d)
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    sessions[pid] = int(fh.read().rsplit(")", 1)[1].split()[3])  # state ppid pgrp SESSION
            except (OSError, ValueError, IndexError):
                continue
            if inodes:
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    fds = []
                for fd in fds:
                    try:
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        stepds.add(pid)
                        break
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
            except OSError:
                continue
            if conf in environ and any(e.startswith(b"SLURMD_NODENAME=") for e in environ):
                tasks.add(pid)
        step_sessions = {sessions[p] for p in stepds if sessions.get(p, 0) > 1}
        out = stepds | tasks | {p for p, sid in sessions.items() if sid in step_sessions}
        return sorted(p for p in out if p != me and _alive(p))


#: Seconds a step gives its local cluster's stop (cancel every job, stop every daemon) when it
#: ends, SIGTERM included: well inside Kubernetes' default 30 s grace period.
STEP_STOP_TIMEOUT_S = 20.0


class OwnedSlurm(LocalSlurm):
    """A local Slurm that one step started and owns: :meth:`stop` (the step's ``finally``, also
    on SIGTERM) cancels every job and stops every daemon within :data:`STEP_STOP_TIMEOUT_S`
    plus the kill grace; a :class:`stepkit.procs.Guard` started before the first daemon does
    the same if the step is killed outright (SIGKILL)."""

    guard = None

    def start(
        self,
        cfg: SimConfig,
        factor: float = 1.0,
        timeout: float = 90,
        accounting: bool = False,
        users: int = 0,
        unknown: bool = False,
        debug_flags: str = "",
    ) -> dict:
        from stepkit.procs import Guard

        if self.running():  # another cluster's root: neither guard nor stop it
            raise RuntimeError(f"a local Slurm already runs under {self.root} ({self.running()}): stop it first")
        self.guard = Guard(
            [sys.executable, "-m", "lab.slurm.cluster", "stop", "--root", str(self.root)],
            f"the local Slurm under {self.root}",
        )
        try:
            return super().start(
                cfg, factor, timeout, accounting=accounting, users=users, unknown=unknown, debug_flags=debug_flags
            )
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STEP_STOP_TIMEOUT_S) -> list[str]:
        said = super().stop(timeout)
        left = self.leftovers() + list(self.running().values())
        if self.guard is not None:
            if left:  # let the guard try once more after the step has gone
                log.warning("local Slurm under %s: still running after stop: %s", self.root, left)
            else:
                self.guard.disarm()
                self.guard = None
        for line in said:
            log.info("local Slurm under %s: %s", self.root, line)
        return said


#: The most slurmd a local cluster starts (one process and one port each on this machine).
MAX_LOCAL_NODES = 256
#: The most trace users ``make slurm SLURM_USERS=N`` creates accounts for (one association each,
#: created through slurmdbd before slurmctld starts: about a second per 200).
MAX_LOCAL_USERS = 10_000
#: The largest time compression (trace seconds per real second), as for ``replay-slurm --factor``.
MAX_FACTOR = 1e6


def check_local_size(cfg: SimConfig, flag: str = "--slurm-root") -> None:
    """A local cluster of ``cfg.nodes`` slurmd is a bounded amount of work: at most
    :data:`MAX_LOCAL_NODES`, checked before anything starts (:class:`StepError`)."""
    if cfg.nodes > MAX_LOCAL_NODES:
        raise StepError(
            f"{flag}: a local Slurm of the cluster config's {cfg.nodes} nodes would start {cfg.nodes} "
            f"slurmd; at most {MAX_LOCAL_NODES} (pass --nodes N)"
        )


def check_root(root: str, flag: str = "--slurm-root") -> None:
    """A ``--slurm-root`` a local cluster can live in (a folder, or a path that can become one),
    checked before a step reads or writes anything: :class:`StepError` naming the flag."""
    p = Path(root)
    if p.exists() and not p.is_dir():
        raise StepError(f"{flag} {root}: exists and is not a folder")
    up = p if p.exists() else next((q for q in p.absolute().parents if q.exists()), None)
    if up is None or not up.is_dir() or not os.access(up, os.W_OK | os.X_OK):
        raise StepError(f"{flag} {root}: cannot create or write a folder there ({up} is not a writable folder)")


def start_local(
    root: str,
    cfg: SimConfig,
    factor: float,
    accounting: bool = False,
    users: int = 0,
    unknown: bool = False,
    debug_flags: str = "",
) -> LocalSlurm:
    """A local Slurm under ``root`` for one step (``--slurm-root``), started with the cluster
    config's settings at time compression ``factor`` (with ``accounting``: slurmdbd and accounts
    for ``users`` trace users) and owned by the step (:class:`OwnedSlurm`: stopped on every exit,
    SIGTERM and SIGKILL included); a failed start is the step's bad input."""
    cluster = OwnedSlurm(root)
    try:
        cluster.start(cfg, factor, accounting=accounting, users=users, unknown=unknown, debug_flags=debug_flags)
    except RuntimeError as exc:
        raise StepError(f"--slurm-root {root}: {exc}") from None
    return cluster


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.slurm.cluster", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("start", "stop", "status"))
    ap.add_argument("--root", default="var/slurm")
    ap.add_argument("--factor", type=float, default=1.0, help="time compression (trace seconds per real second)")
    ap.add_argument(
        "--accounting",
        action="store_true",
        help="also start slurmdbd on a local MariaDB (age factor, fair share and limits enforced)",
    )
    ap.add_argument(
        "--debug-flags", default="", help="slurmctld DebugFlags (e.g. Backfill), logged to log/slurmctld.log"
    )
    ap.add_argument(
        "--users", type=int, default=0, help="with --accounting: trace users to create accounts u0..u<N-1> for (0)"
    )
    from mirage_tasks.sim.config import add_config_arguments

    add_config_arguments(ap)
    a = ap.parse_args(argv)
    c = LocalSlurm(a.root)
    if a.action == "start":
        return _start_cli(c, a)
    if a.action == "stop":
        for line in c.stop():
            print(line)
        left = c.leftovers() + list(c.running().values())
        if left:
            print(f"still running: {left}", file=sys.stderr)
            return 1
        return 0
    if not c._records():  # never started here, or stopped (stop removes the records)
        print(f"no local Slurm running under {c.root}")
        return 3
    lines, bad = c.status()
    for line in lines:
        print(line)
    if "slurmctld" not in bad and c.running().get("slurmctld"):
        print(c.cmd("sinfo", check=False, timeout=20).stdout, end="")
    if bad:
        print(
            f"local Slurm under {c.root}: not running: {', '.join(bad)} (make slurm-stop, then make slurm)",
            file=sys.stderr,
        )
        return 1
    return 0


def _start_cli(c: LocalSlurm, a: argparse.Namespace) -> int:
    """``start`` from the command line (``make slurm``): the counts bounded before anything starts
    (exit 2 naming the flag and its make variable); SIGTERM, SIGINT or SIGHUP while it starts
    stops what it has started and exits 128 + the signal."""
    if not 0 < a.factor <= MAX_FACTOR:  # also NaN
        print(f"--factor (SLURM_FACTOR) {a.factor:g}: must be > 0 and at most {MAX_FACTOR:g}", file=sys.stderr)
        return 2
    if a.users < 0 or (a.users and not a.accounting):
        print("--users (SLURM_USERS) N (N >= 0) needs --accounting (SLURM_ACCOUNTING=1)", file=sys.stderr)
        return 2
    if a.users > MAX_LOCAL_USERS:
        print(f"--users (SLURM_USERS) {a.users}: at most {MAX_LOCAL_USERS} (one account each)", file=sys.stderr)
        return 2
    if a.cluster_config is None and a.cfg_nodes is None:
        a.cfg_nodes = 4
    try:
        cfg = config_from_args(a)
        check_local_size(cfg, "--nodes (SLURM_NODES)")
    except StepError as exc:
        print(f"slurm start: {exc}", file=sys.stderr)
        return 2

    def stopped(signum, frame):
        for s in STOP_SIGNALS:  # one stop: a second Ctrl-C must not cut the first one's cleanup short
            signal.signal(s, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for s in STOP_SIGNALS:
        signal.signal(s, stopped)
    try:
        info = c.start(cfg, a.factor, accounting=a.accounting, users=a.users, debug_flags=a.debug_flags)
    except RuntimeError as exc:
        print(f"slurm start failed: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # start() stopped what it had started
        print(
            f"slurm start stopped by signal {int(exc.code) - 128}; nothing of {c.root} is left running", file=sys.stderr
        )
        raise
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    print(
        f"local Slurm: {info['nodes']} nodes idle, slurmctld 127.0.0.1:{info['ctld_port']}, slurmd ports "
        f"{info['node_ports'][0]}-{info['node_ports'][1]}, compression x{a.factor:g}; state in {c.root}"
    )
    if info["accounting"]:
        acc = info["accounting"]
        print(
            f"  accounting: slurmdbd 127.0.0.1:{acc['dbd_port']}, MariaDB 127.0.0.1:{acc['db_port']}; accounts "
            f"u0..u{acc['users'] - 1} and service under trace"
            if acc["users"]
            else f"  accounting: slurmdbd 127.0.0.1:{acc['dbd_port']}, MariaDB 127.0.0.1:{acc['db_port']}; accounts "
            "service under trace (--users N adds trace users)"
        )
    for u in info["unsupported"]:
        print(f"  not enforced: {u}")
    print(f"clients: export SLURM_CONF={c.paths.conf}   (or source {c.root}/env.sh); stop: make slurm-stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
