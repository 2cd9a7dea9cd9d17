"""Start and stop a real local Slurm (munge, one slurmctld, N ``slurmd -N nX``) as root.

``python -m mirage_tasks.slurm.cluster start|stop|status [--root var/slurm] [--cluster-config
ls6] [--nodes N] [--factor F]`` (``make slurm`` / ``make slurm-stop`` / ``make slurm-status``)
and :class:`LocalSlurm` (the pytest fixture). Everything lives under ``--root``: the munge key
and socket, ``slurm.conf``, state, spool, logs, the job-completion log and one pid file per
daemon. Ports are free 127.0.0.1 ports found at start. ``stop`` cancels every job, waits for
their steps to end, then stops each daemon by the pid it recorded (slurmd, slurmctld, slurmdbd,
mariadbd, munged, in that order) and checks nothing of this root is left running.

With ``--accounting`` (``make slurm SLURM_ACCOUNTING=1``) the cluster keeps accounts: a fresh
MariaDB under ``<root>/mysql`` (127.0.0.1, a free port; root only through its socket, slurmdbd's
own user with a random password kept in the mode-600 ``slurmdbd.conf``), slurmdbd on a free
port, and the association tree of :func:`mirage_tasks.slurm.conf.associations` (one account per
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

from stepkit import StepError

from ..sim.config import SimConfig, config_from_args
from .conf import Paths, associations, render, render_dbd, scaled, unsupported

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
#: started at the same instant (bench/keeper_campaign.py starts one per window) could otherwise both
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


class LocalSlurm:
    """One local cluster under ``root``."""

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
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True, check=check,
                              timeout=timeout)

    def _spawn(self, name: str, argv: list[str], log: Path) -> int:
        fh = open(log, "ab")
        p = subprocess.Popen(argv, env=self.env(), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=str(self.root))
        fh.close()
        (self.root / "pids").mkdir(exist_ok=True)
        (self.root / "pids" / f"{name}.started").write_text(str(p.pid))
        return p.pid

    def _pids(self) -> dict[str, int]:
        out = {}
        d = self.root / "pids"
        if d.is_dir():
            for f in d.glob("*.started"):
                try:
                    out[f.stem] = int(f.read_text().strip())
                except ValueError:
                    pass
        return out

    def running(self) -> dict[str, int]:
        return {k: v for k, v in self._pids().items() if _alive(v)}

    # ------------------------------------------------------------------ start
    def start(self, cfg: SimConfig, factor: float = 1.0, timeout: float = 90, accounting: bool = False,
              users: int = 0, unknown: bool = False, debug_flags: str = "") -> dict:
        """Start the cluster; with ``accounting`` also a MariaDB and slurmdbd under the root, with the
        association tree of :func:`~.conf.associations` for ``users`` trace users (ids 0..users-1;
        ``unknown``: and jobs without one) built before slurmctld starts. ``debug_flags``:
        slurmctld's ``DebugFlags`` (its log, ``log/slurmctld.log``, then says why)."""
        if os.geteuid() != 0:
            raise RuntimeError("the local Slurm runs its daemons as root (SlurmUser=root); run as root")
        miss = missing_binaries()
        if miss:
            raise RuntimeError(f"not installed: {', '.join(miss)} (make system-deps installs Debian's slurmctld, "
                               "slurmd, slurm-client and munge)")
        if accounting and missing_accounting():
            raise RuntimeError(f"accounting: not installed: {', '.join(missing_accounting())} (make system-deps "
                               "installs Debian's slurmdbd and mariadb-server)")
        if self.running():
            raise RuntimeError(f"a local Slurm already runs under {self.root} ({self.running()}): stop it first")
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
            subprocess.run([_bin("mungekey"), "--create", f"--keyfile={p.munge_key}"], check=True,
                           capture_output=True)
        os.chmod(p.munge_key, 0o600)
        # slurmctld, the n slurmd (and MariaDB, slurmdbd) on consecutive ports outside the ephemeral range,
        # chosen and bound under the machine's port lock (released once every daemon listens)
        with port_lock():
            return self._start_daemons(cfg, factor, timeout, accounting, users, unknown, debug_flags, n)

    def _start_daemons(self, cfg: SimConfig, factor: float, timeout: float, accounting: bool, users: int,
                       unknown: bool, debug_flags: str, n: int) -> dict:
        p = self.paths
        base = free_port_range(n + 3)
        ctld, first = base, base + 1
        db_port = dbd_port = None
        if accounting:
            db_port, dbd_port = base + n + 1, base + n + 2
        (self.root / "slurm.conf").write_text(render(cfg, factor, p, ctld, (first, first + n - 1), dbd_port=dbd_port,
                                                          debug_flags=debug_flags))
        for i in range(1, n + 1):
            os.makedirs(f"{p.spool}/n{i}", exist_ok=True)
        (self.root / "env.sh").write_text(f"# written by mirage_tasks.slurm.cluster start\nexport SLURM_CONF={p.conf}\n")
        info = {"root": str(self.root), "nodes": n, "factor": factor, "ctld_port": ctld,
                "node_ports": [first, first + n - 1], "config": cfg.to_dict(), "scaled": scaled(cfg, factor),
                "unsupported": unsupported(cfg, accounting), "started_at": time.time(),
                "accounting": {"db_port": db_port, "dbd_port": dbd_port, "users": int(users), "unknown": bool(unknown)}
                if accounting else None}
        self.info_file.write_text(json.dumps(info, indent=1))
        try:
            self._spawn("munged", [_bin("munged"), "-F", "--force", f"--socket={p.munge_socket}",
                                   f"--key-file={p.munge_key}", f"--pid-file={p.munge_dir}/munged.pid",
                                   f"--log-file={p.logs}/munged.log", f"--seed-file={p.munge_dir}/munged.seed"],
                        Path(p.logs) / "munged.out")
            self._wait(lambda: os.path.exists(p.munge_socket), 20, "munged socket", "munged.log")
            if accounting:
                self._start_accounting(cfg, int(users), unknown, db_port, dbd_port, timeout)
            self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-i", "-f", p.conf], Path(p.logs) / "slurmctld.out")
            self._wait(lambda: self.cmd("scontrol", "ping", check=False, timeout=10).stdout.count("UP") > 0,
                       timeout, "slurmctld to answer", "slurmctld.log")
            for i in range(1, n + 1):
                self._spawn(f"slurmd-n{i}", [_bin("slurmd"), "-D", "-N", f"n{i}", "-f", p.conf],
                            Path(p.logs) / f"slurmd-n{i}.out")
            self._wait(lambda: self.idle_nodes() >= n, timeout, f"{n} idle nodes", "slurmctld.log")
        except Exception:
            self.stop()
            raise
        return info

    def _start_accounting(self, cfg: SimConfig, users: int, unknown: bool, db_port: int, dbd_port: int,
                          timeout: float) -> None:
        """A fresh MariaDB (root only through its socket; slurmdbd's own user with a random
        password over 127.0.0.1), slurmdbd, then the cluster, QOS and associations."""
        import secrets

        p = self.paths
        r = subprocess.run([_bin("mariadb-install-db"), "--no-defaults", f"--datadir={p.db_dir}", "--user=root",
                            "--auth-root-authentication-method=socket", "--skip-test-db"],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode:
            raise RuntimeError(f"mariadb-install-db failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        self._spawn("mariadbd", [_bin("mariadbd"), "--no-defaults", f"--datadir={p.db_dir}", f"--socket={p.db_socket}",
                                 f"--port={db_port}", "--bind-address=127.0.0.1", "--user=root",
                                 f"--pid-file={p.pids}/mariadbd.pid", f"--log-error={p.logs}/mariadb.err",
                                 "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=64M",
                                 "--innodb-lock-wait-timeout=900", "--max-connections=50"],
                    Path(p.logs) / "mariadbd.out")
        sql = [_bin("mariadb"), "--no-defaults", f"--socket={p.db_socket}", "-u", "root", "-e"]
        self._wait(lambda: subprocess.run(sql + ["SELECT 1"], capture_output=True, timeout=10).returncode == 0,
                   timeout, "MariaDB to answer", "mariadb.err")
        password = secrets.token_hex(16)
        r = subprocess.run(sql + [f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                                  "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode:
            raise RuntimeError(f"MariaDB: could not create slurmdbd's user: {r.stderr.strip()}")
        fd = os.open(p.dbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:  # slurmdbd refuses a readable one (it holds the password)
            fh.write(render_dbd(p, dbd_port, db_port, password))
        os.chmod(p.dbd_conf, 0o600)
        self._spawn("slurmdbd", [_bin("slurmdbd"), "-D"], Path(p.logs) / "slurmdbd.out")
        self._wait(lambda: self.cmd("sacctmgr", "-n", "-P", "list", "cluster", check=False, timeout=10).returncode == 0,
                   timeout, "slurmdbd to answer", "slurmdbd.log")
        for args in associations(cfg, users, unknown):
            r = self.cmd("sacctmgr", "-i", *args, check=False, timeout=120)
            if r.returncode:
                raise RuntimeError(f"sacctmgr {' '.join(args)[:200]} failed ({r.returncode}): "
                                   f"{(r.stderr or r.stdout).strip()[-600:]}")

    def _wait(self, cond, timeout: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [k for k, v in self._pids().items() if not _alive(v)]
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

    def idle_nodes(self) -> int:
        r = self.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
        return sum(1 for ln in r.stdout.splitlines() if ln.split()[-1:] == ["idle"])

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 60) -> list[str]:
        """Cancel every job, stop each daemon this root started; returns what was stopped."""
        said = []
        pids = self.running()
        if "slurmctld" in pids:
            deadline = time.monotonic() + timeout / 2
            try:  # a slurmctld that does not answer must not keep its daemons alive: they are killed below
                r = self.cmd("scancel", "--full", "--user=root", check=False, timeout=max(1.0, timeout / 2))
                said.append(f"cancelled every job (scancel status {r.returncode})")
                while time.monotonic() < deadline:
                    r = self.cmd("squeue", "-h", "-o", "%i", check=False,
                                 timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                    if r.returncode == 0 and not r.stdout.strip():
                        break
                    time.sleep(0.5)
            except (subprocess.SubprocessError, OSError) as exc:
                said.append(f"could not cancel the jobs through slurmctld ({exc}); stopping the daemons")
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
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
                said.append(f"killed leftover job process {pid}")
            except ProcessLookupError:
                pass
        for f in Path(self.paths.pids).glob("*.started") if os.path.isdir(self.paths.pids) else []:
            f.unlink()
        return said

    def leftovers(self) -> list[int]:
        """Processes still running with this root's SLURM_CONF in their environment or its
        paths on their command line (slurmstepd and the jobs it ran)."""
        conf = self.paths.conf.encode()
        prefix = str(self.root).encode() + b"/"
        me = os.getpid()
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    args = fh.read().split(b"\0")
                with open(f"/proc/{d}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
            except OSError:
                continue
            if b"python" in args[0] or b"pytest" in args[0]:
                continue  # the callers (this process's parents) carry SLURM_CONF too
            # exactly this root: its SLURM_CONF, or an argument inside it (not a sibling root's)
            if (b"SLURM_CONF=" + conf) in environ or any(a == conf or a.startswith(prefix) for a in args[1:]):
                if _alive(int(d)):
                    out.append(int(d))
        return out


#: Seconds a step gives its local cluster's stop (cancel every job, stop every daemon) when it
#: ends, SIGTERM included: well inside Kubernetes' default 30 s grace period.
STEP_STOP_TIMEOUT_S = 20.0


class OwnedSlurm(LocalSlurm):
    """A local Slurm that one step started and owns: :meth:`stop` (the step's ``finally``, also
    on SIGTERM) cancels every job and stops every daemon within :data:`STEP_STOP_TIMEOUT_S`
    plus the kill grace; a :class:`stepkit.procs.Guard` started before the first daemon does
    the same if the step is killed outright (SIGKILL)."""

    guard = None

    def start(self, cfg: SimConfig, factor: float = 1.0, timeout: float = 90, accounting: bool = False,
              users: int = 0, unknown: bool = False, debug_flags: str = "") -> dict:
        from stepkit.procs import Guard

        if self.running():  # another cluster's root: neither guard nor stop it
            raise RuntimeError(f"a local Slurm already runs under {self.root} ({self.running()}): stop it first")
        self.guard = Guard([sys.executable, "-m", "mirage_tasks.slurm.cluster", "stop", "--root", str(self.root)],
                           f"the local Slurm under {self.root}")
        try:
            return super().start(cfg, factor, timeout, accounting=accounting, users=users, unknown=unknown,
                                 debug_flags=debug_flags)
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


def check_local_size(cfg: SimConfig, flag: str = "--slurm-root") -> None:
    """A local cluster of ``cfg.nodes`` slurmd is a bounded amount of work: at most
    :data:`MAX_LOCAL_NODES`, checked before anything starts (:class:`StepError`)."""
    if cfg.nodes > MAX_LOCAL_NODES:
        raise StepError(f"{flag}: a local Slurm of the cluster config's {cfg.nodes} nodes would start {cfg.nodes} "
                        f"slurmd; at most {MAX_LOCAL_NODES} (pass --nodes N)")


def check_root(root: str, flag: str = "--slurm-root") -> None:
    """A ``--slurm-root`` a local cluster can live in (a folder, or a path that can become one),
    checked before a step reads or writes anything: :class:`StepError` naming the flag."""
    p = Path(root)
    if p.exists() and not p.is_dir():
        raise StepError(f"{flag} {root}: exists and is not a folder")
    up = p if p.exists() else next((q for q in p.absolute().parents if q.exists()), None)
    if up is None or not up.is_dir() or not os.access(up, os.W_OK | os.X_OK):
        raise StepError(f"{flag} {root}: cannot create or write a folder there ({up} is not a writable folder)")


def check_conf(conf: str | None, flag: str) -> str:
    """The slurm.conf a step's Slurm clients will read (``conf``, else ``$SLURM_CONF``): it must
    be a readable file, checked before anything starts (a client retries a missing one for a
    minute per call). :class:`StepError` naming ``flag`` or ``SLURM_CONF``; returns the path."""
    path = conf or os.environ.get("SLURM_CONF")
    where = f"{flag} {conf}" if conf else f"SLURM_CONF={path}"
    if not path:
        raise StepError(f"no cluster: pass {flag} (or set SLURM_CONF)" if flag != "--slurm-root" else
                        "no cluster: pass --slurm-root DIR (a local Slurm for this run) or set SLURM_CONF")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise StepError(f"{where}: no such readable file (the cluster's slurm.conf)")
    return path


def start_local(root: str, cfg: SimConfig, factor: float, accounting: bool = False,
                users: int = 0, unknown: bool = False, debug_flags: str = "") -> LocalSlurm:
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
    ap = argparse.ArgumentParser(prog="python -m mirage_tasks.slurm.cluster", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("start", "stop", "status"))
    ap.add_argument("--root", default="var/slurm")
    ap.add_argument("--factor", type=float, default=1.0, help="time compression (trace seconds per real second)")
    ap.add_argument("--accounting", action="store_true",
                    help="also start slurmdbd on a local MariaDB (age factor, fair share and limits enforced)")
    ap.add_argument("--debug-flags", default="", help="slurmctld DebugFlags (e.g. Backfill), logged to log/slurmctld.log")
    ap.add_argument("--users", type=int, default=0,
                    help="with --accounting: trace users to create accounts u0..u<N-1> for (0)")
    from ..sim.config import add_config_arguments

    add_config_arguments(ap)
    a = ap.parse_args(argv)
    c = LocalSlurm(a.root)
    if a.action == "start":
        if a.factor <= 0:
            print("--factor must be > 0", file=sys.stderr)
            return 2
        if a.users < 0 or (a.users and not a.accounting):
            print("--users N (N >= 0) needs --accounting", file=sys.stderr)
            return 2
        if a.cluster_config is None and a.cfg_nodes is None:
            a.cfg_nodes = 4
        cfg = config_from_args(a)
        try:
            info = c.start(cfg, a.factor, accounting=a.accounting, users=a.users, debug_flags=a.debug_flags)
        except RuntimeError as exc:
            print(f"slurm start failed: {exc}", file=sys.stderr)
            return 1
        print(f"local Slurm: {info['nodes']} nodes idle, slurmctld 127.0.0.1:{info['ctld_port']}, slurmd ports "
              f"{info['node_ports'][0]}-{info['node_ports'][1]}, compression x{a.factor:g}; state in {c.root}")
        if info["accounting"]:
            acc = info["accounting"]
            print(f"  accounting: slurmdbd 127.0.0.1:{acc['dbd_port']}, MariaDB 127.0.0.1:{acc['db_port']}; accounts "
                  f"u0..u{acc['users'] - 1} and service under trace" if acc["users"] else
                  f"  accounting: slurmdbd 127.0.0.1:{acc['dbd_port']}, MariaDB 127.0.0.1:{acc['db_port']}; accounts "
                  "service under trace (--users N adds trace users)")
        for u in info["unsupported"]:
            print(f"  not enforced: {u}")
        print(f"clients: export SLURM_CONF={c.paths.conf}   (or source {c.root}/env.sh); stop: make slurm-stop")
        return 0
    if a.action == "stop":
        for line in c.stop():
            print(line)
        left = c.leftovers() + list(c.running().values())
        if left:
            print(f"still running: {left}", file=sys.stderr)
            return 1
        return 0
    run = c.running()
    for k in sorted(run):
        print(f"{k}: running (pid {run[k]})")
    if not run:
        print(f"no local Slurm running under {c.root}")
    else:
        print(c.cmd("sinfo", check=False).stdout, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
