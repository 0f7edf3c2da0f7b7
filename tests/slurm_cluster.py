"""A real single-host Slurm cluster for tests: Debian's slurm-wlm 22.05 + munge, run from a tmp dir.

The module-scoped fixture `slurm_cluster` starts its own munged, slurmctld and slurmd (foreground child processes,
free ports, every file under tmp; no systemd, no cgroups, nothing under /etc, /run or /var), waits until the node is
idle, yields a `SlurmCluster`, and stops everything on teardown. It skips (never fails) when the binaries are missing,
when not root, or when the daemons do not come up. Use it with:

    from tests.slurm_cluster import slurm_cluster  # noqa: F401
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

INSTALL_HINT = "apt-get install slurmctld slurmd slurm-client munge (Debian)"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scancel")
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


@dataclass
class SlurmCluster:
    """What a test gets: `env` for subprocess (os.environ + SLURM_CONF, no inherited SLURM_*), the conf, the logs."""

    root: Path
    conf: Path
    node: str
    env: dict[str, str]
    logs: dict[str, Path] = field(default_factory=dict)

    def run(self, *argv: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, squeue, scontrol, ...) against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=check)

    def sbatch_wait(self, script: str | os.PathLike, cwd: str | os.PathLike | None = None, timeout: float = 120.0):
        """`sbatch --wait --parsable SCRIPT`: returns (returncode, job_id) once the job ended; returncode is the
        job's exit code (sbatch --wait exits with it). On timeout the job is cancelled and TimeoutError raised
        with the daemons' log tails."""
        proc = subprocess.Popen(
            ["sbatch", "--wait", "--parsable", str(script)],
            cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            job_id = _job_id(out)  # often empty: sbatch's stdout is block-buffered into the pipe, lost on kill
            if not job_id:
                script_path = str(Path(cwd or ".", script).resolve())
                listed = self.run("squeue", "-h", "-o", "%A %o", check=False).stdout.splitlines()
                job_id = ",".join(line.split()[0] for line in listed if line.split()[1:] == [script_path])
            if job_id:
                self.run("scancel", job_id, check=False)
            raise TimeoutError(f"sbatch --wait {script}: job {job_id or '?'} still running after {timeout:.0f}s\n"
                               f"{err}\n{self.tail_logs()}") from None
        job_id = _job_id(out)
        if not job_id:
            raise RuntimeError(f"sbatch {script} printed no job id (rc={proc.returncode}):\n{out}\n{err}\n"
                               f"{self.tail_logs()}")
        return proc.returncode, job_id

    def tail_logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for failure messages."""
        return "\n".join(_tail(path, lines) for path in self.logs.values())


def _job_id(out: str) -> str:
    """sbatch --parsable prints 'jobid' or 'jobid;cluster'."""
    first = out.strip().splitlines()[0] if out.strip() else ""
    return first.split(";")[0].strip()


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"--- {path.name}: (none)"
    return f"--- {path.name}:\n" + "\n".join(text)


def _free_ports(count: int) -> list[int]:
    """Ports free right now (bound together so they differ); the daemons take them a moment later."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _slurm_conf(root: Path, node: str, munge_socket: Path, ctld_port: int, slurmd_port: int) -> str:
    # No cgroups and no systemd: linuxproc tracks processes, task/none binds nothing, no accounting.
    # The node is reached at 127.0.0.1 whatever the hostname resolves to; slurmd is started with -N node.
    return "\n".join([
        "ClusterName=hltest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0",
        "MpiDefault=none",
        "ReturnToService=2",
        "MailProg=/bin/true",
        "InactiveLimit=0",
        "KillWait=5",
        # sbatch --wait polls at 2 s, then 8 s, 32 s unless MinJobAge <= 4: 4 keeps it at 2 s (a finished job stays
        # listed >= 4 s, until slurmctld's next purge, so sbatch still sees its exit code).
        "MinJobAge=4",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        # RealMemory left out (1 MB): jobs ask for no memory, so the host's size never matters.
        f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        "",
    ])


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when pytest dies (killed, crashed), so no daemon outlives the run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _ours(marker: str) -> list[int]:
    """Pids whose environment holds this cluster's SLURM_CONF (the daemons' strays: slurmstepd, job tasks)."""
    needle = marker.encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each (in the order given), SIGKILL after STOP_GRACE_S."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _kill_pids(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.1)


class Unavailable(Exception):
    """The cluster cannot run here; the message says why (the fixture skips with it)."""


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    """Module-scoped: its daemons are pytest's children, and later tests check that pytest has none."""
    try:
        with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except Unavailable as e:
        pytest.skip(str(e))


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[SlurmCluster]:
    """The cluster, its files under root (also used by bench/suite.py); Unavailable when it cannot run here."""
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None
               and not Path("/usr/sbin", name).exists()]
    if missing:
        raise Unavailable(f"Slurm is not installed: {INSTALL_HINT} (missing: {', '.join(missing)})")
    if os.geteuid() != 0:
        raise Unavailable("the Slurm test cluster needs root (slurmd starts job steps as the submitting user)")

    def exe(name: str) -> str:
        return shutil.which(name) or str(Path("/usr/sbin", name))

    for sub in ("state", "spool"):
        (root / sub).mkdir()
    node = socket.gethostname().split(".")[0]
    munge_socket = root / "munge.socket"
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))  # what `mungekey --create` writes: 1024 random bits
    os.chmod(key, 0o400)  # munged runs as root here, so the key is root's, 0400 (munged refuses one others can read)

    ctld_port, slurmd_port = _free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, node, munge_socket, ctld_port, slurmd_port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # not the outer job's, if any
    env["SLURM_CONF"] = str(conf)
    # munged --foreground logs to stderr (munged.out); slurmctld/slurmd write their LogFile (and stderr to *.out).
    logs = {"munged": root / "munged.out", "slurmctld": root / "slurmctld.log", "slurmd": root / "slurmd.log"}
    cluster = SlurmCluster(root=root, conf=conf, node=node, env=env, logs=logs)

    procs: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> None:
        out = open(root / f"{name}.out", "wb")
        logs.setdefault(f"{name}.out", root / f"{name}.out")
        procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True,  # Ctrl-C reaches pytest only: it stops them in order
                                      preexec_fn=_die_with_parent))
        out.close()

    try:
        # --force: tmp dirs are 0700 and munged wants its socket's dir world-executable; as root it only warns.
        start("munged", [exe("munged"), "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                         f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
                         f"--seed-file={root / 'munged.seed'}"])
        _wait_for(lambda: munge_socket.exists(), procs, cluster, "munged's socket")
        start("slurmctld", [exe("slurmctld"), "-D", "-c", "-f", str(conf)])
        start("slurmd", [exe("slurmd"), "-D", "-N", node, "-f", str(conf)])

        def node_idle() -> bool:
            try:
                res = cluster.run("sinfo", "-h", "-n", node, "-o", "%T", check=False, timeout=10)
            except subprocess.TimeoutExpired:
                return False
            return res.returncode == 0 and res.stdout.strip().rstrip("*") == "idle"

        _wait_for(node_idle, procs, cluster, f"node {node} idle in sinfo")
        yield cluster
    finally:
        _teardown(cluster, procs)


def _wait_for(ready, procs: list[subprocess.Popen], cluster: SlurmCluster, what: str) -> None:
    """Poll ready() until START_TIMEOUT_S; skip (with the logs) when a daemon died or time ran out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            names = ", ".join(f"{Path(p.args[0]).name} (rc={p.returncode})" for p in dead)
            raise Unavailable(f"Slurm test cluster did not come up: {names} exited\n{cluster.tail_logs()}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise Unavailable(f"Slurm test cluster did not come up: no {what} after {START_TIMEOUT_S:.0f}s\n"
                        f"{cluster.tail_logs()}")
        time.sleep(0.2)


def _teardown(cluster: SlurmCluster, procs: list[subprocess.Popen]) -> None:
    """Cancel what is left, stop slurmd, slurmctld, munged (reverse start order), then kill any stray of ours."""
    if len(procs) == 3 and all(p.poll() is None for p in procs):
        try:
            jobs = cluster.run("squeue", "-h", "-o", "%A", check=False, timeout=10).stdout.split()
            if jobs:
                cluster.run("scancel", *jobs, check=False, timeout=10)
        except subprocess.TimeoutExpired:
            pass  # the stray sweep below ends their steps
    _stop(list(reversed(procs)))
    _kill_pids(_ours(f"SLURM_CONF={cluster.conf}"))
