"""Ranks started by the cluster's own launcher: OpenMPI's ``mpirun`` (cluster.launch=mpi) or Slurm's ``srun``
(cluster.launch=slurm, inside an allocation).

The launcher hosts the rendezvous store (as with the local backend), writes every rank's environment to
``rank_env.json`` and runs one ``mpirun``/``srun`` command, built as an argument list, that starts
``launcher.launch.rank_start`` once per rank: it maps the scheduler's variables to torch's, redirects the rank's
output to ``rank.N/`` and records how the rank ended (``rank.N/exit.json``). The launcher supervises through those
records and the heartbeats; the scheduler's own output goes to ``backend.log``. Ranks on other hosts see the run
dir through a shared file system (as mpirun and Slurm users have; the elastic backend needs none).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher.errors import ConfigError
from launcher.plan import RunPlan
from launcher.rundir import RunDir

FORWARDED_ENV = ("PYTHONPATH", "HL_CACHE_DIR", "PATH")
"""Variables of the launcher that mpirun passes on to ranks on other hosts (-x); the plan's own are in
rank_env.json."""
SLURM_ALLOCATION = "SLURM_JOB_ID"
LINGER_S = 0.5
"""How long mpirun/srun get to end by themselves once every rank has recorded its end, when stopping."""


def rank_command(run_dir: RunDir, scheduler: str, plan: RunPlan) -> list[str]:
    """What mpirun/srun starts on each rank's host."""
    return [sys.executable, "-m", "launcher.launch.rank_start", str(run_dir.path.resolve()), scheduler, "--",
            *plan.rank_args(str(run_dir.path.resolve()))]


def mpirun_command(plan: RunPlan, run_dir: RunDir, hosts: tuple[str, ...], extra: list[str], as_root: bool,
                   mpirun: str = "mpirun") -> list[str]:
    """``mpirun`` for the plan's world: the hosts in node order with nproc_per_node slots each (ranks fill a host
    before the next: the plan's blocks), no core binding (OMP_NUM_THREADS shares the cores), the launcher's
    forwarded variables, then cluster.launcher_args."""
    cmd = [mpirun, "-n", str(plan.world_size), "--bind-to", "none", "--map-by", "slot"]
    if hosts:
        cmd += ["--host", ",".join(f"{h}:{plan.nproc_per_node}" for h in hosts)]
    else:  # this host: as many ranks as planned, whatever slots OpenMPI counts
        cmd += ["--oversubscribe"]
    if as_root:
        cmd += ["--allow-run-as-root"]  # mpirun refuses root unless told; the ranks run as the launcher does
    for name in FORWARDED_ENV:
        cmd += ["-x", name] if name in os.environ else []
    return [*cmd, *extra, *rank_command(run_dir, "mpi", plan)]


def srun_command(plan: RunPlan, run_dir: RunDir, extra: list[str]) -> list[str]:
    """``srun`` for the plan's world inside the allocation: nnodes × nproc_per_node tasks in blocks (Slurm's
    default distribution), one failed task ends the step, no CPU binding (OMP_NUM_THREADS shares the cores)."""
    return ["srun", f"--nodes={plan.nnodes}", f"--ntasks={plan.world_size}",
            f"--ntasks-per-node={plan.nproc_per_node}", "--distribution=block", "--kill-on-bad-exit=1",
            "--cpu-bind=none", f"--job-name={run_dir.name}", *extra, *rank_command(run_dir, "slurm", plan)]


def sbatch_script(plan: RunPlan, argv: list[str], cwd: Path, log_dir: Path, cpus_per_task: int) -> str:
    """A batch script that runs this plan inside an allocation: ``sbatch job.sbatch``. Every argument is quoted
    for the shell (shlex.quote): no value of the config reaches it unquoted."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(plan.name)}",
        f"#SBATCH --nodes={plan.nnodes}",
        f"#SBATCH --ntasks-per-node={plan.nproc_per_node}",
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f"#SBATCH --output={q(str(log_dir / 'slurm-%j.out'))}",
    ]
    if plan.device_type == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={plan.nproc_per_node}")
    args = [a for a in argv if not a.startswith(("dry_run=", "cluster.launch="))]
    lines += [
        "# Written by hetero-launch's dry run: the same command, run by srun inside the allocation.",
        "set -euo pipefail",
        f"cd {q(str(cwd))}",
        "exec " + " ".join(q(a) for a in [sys.executable, "-m", "launcher.cli", *args, "cluster.launch=slurm"]),
    ]
    return "\n".join(lines) + "\n"


class ExternalJob:
    """The ranks of one mpirun/srun command (supervise.RankJob), seen through their exit records and pid files."""

    def __init__(self, proc: subprocess.Popen, run_dir: RunDir, ranks: tuple[int, ...]) -> None:
        self._proc, self._run_dir, self.ranks = proc, run_dir, ranks
        self._host = socket.gethostname()

    def poll(self) -> dict[int, int]:
        """Each ended rank's code from its exit record; once mpirun/srun itself has ended, a rank without one
        (never started, or its rank_start was killed) gets the scheduler's exit code (1 if that was 0)."""
        backend = self._proc.poll()  # first: the records of ranks that ended before it are on disk by then
        out = {}
        for rank in self.ranks:
            record = self._run_dir.rank(rank).read_exit()
            if record is not None:
                out[rank] = record["exit_code"]
            elif backend is not None:
                out[rank] = backend or 1
        return out

    def pids(self) -> dict[int, int]:
        out = {}
        for rank in self.ranks:
            found = self._run_dir.rank(rank).read_pid()
            if found is not None and found[0] == self._host:
                out[rank] = found[1]
        return out

    def _recorded(self) -> bool:
        return all(self._run_dir.rank(r).read_exit() is not None for r in self.ranks)

    def stop(self) -> None:
        """SIGTERM to this host's ranks and to mpirun/srun (which forward it to every rank; rank_start passes it on),
        then wait: for the scheduler to end, or, once every rank has recorded its end, LINGER_S more (mpirun takes
        seconds to wind down after its ranks are gone; nothing of the run is left in it). SIGKILL after
        STOP_TIMEOUT_S or on a second signal, to the scheduler's process group and to this host's ranks that have
        not recorded their end."""
        from launcher.launch.supervise import STOP_TIMEOUT_S, SignalException, send_signals

        local = self.pids()
        send_signals([self._proc.pid], (signal.SIGTERM, signal.SIGCONT))
        send_signals(list(local.values()), (signal.SIGTERM, signal.SIGCONT), os.kill)
        deadline, recorded_at = time.monotonic() + STOP_TIMEOUT_S, None
        try:
            while self._proc.poll() is None and time.monotonic() < deadline:
                if recorded_at is None and self._recorded():
                    recorded_at = time.monotonic()
                if recorded_at is not None and time.monotonic() - recorded_at > LINGER_S:
                    break
                time.sleep(0.05)
        except (KeyboardInterrupt, SignalException):
            pass  # a second signal: no more grace
        send_signals([self._proc.pid], (signal.SIGKILL,))
        send_signals([pid for rank, pid in local.items() if self._run_dir.rank(rank).read_exit() is None],
                     (signal.SIGKILL,), os.kill)
        self._proc.wait()
        _wait_ended(list(local.values()))


def _wait_ended(pids: list[int], timeout_s: float = 10.0) -> None:
    """Return once none of pids runs (gone, or a zombie: ended, its parent yet to reap it). A rank whose
    rank_start mpirun killed dies by its parent-death signal a moment later: the launcher must not return before."""
    from launcher.launch.supervise import send_signals
    from launcher.launch.watchdog import process_state

    deadline = time.monotonic() + timeout_s
    while (running := [p for p in pids if process_state(p) not in ("", "Z")]) and time.monotonic() < deadline:
        send_signals(running, (signal.SIGKILL,), os.kill)
        time.sleep(0.02)


def start_job(command: list[str], plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]]) -> ExternalJob:
    """Run mpirun/srun (in its own session, its output in backend.log) for every rank in envs. Its rank dirs hold no
    record of an earlier attempt: a restart moves them to attempt.<k>/ first (attempt.archive_attempt)."""
    with open(run_dir.backend_log, "ab") as log:
        log.write(("$ " + shlex.join(command) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return ExternalJob(proc, run_dir, tuple(sorted(envs)))


def find_program(name: str, key: str, package: str) -> str:
    """The program's path, or a ConfigError saying how to get it (before any run dir exists)."""
    path = shutil.which(name)
    if path is None:
        raise ConfigError(f"{key}: `{name}` is not on PATH. Install it ({package}), or use cluster.launch=local "
                          f"(one host) or elastic (several hosts, torch's own rendezvous).")
    return path
