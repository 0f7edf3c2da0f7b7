"""This host's ranks as torch elastic's processes (``torch.distributed.elastic.multiprocessing.start_processes``),
with our log layout: the job of ``cluster.launch=local`` and of each host of ``cluster.launch=elastic``.

torchrun's own path: each rank starts in its own session with its variables (passed explicitly: the launcher's
os.environ is never changed) and its log files (``RankLogsSpecs.reify``), tied to the launcher's life
(``lifeline``); stopping is ``processes.stop_process_groups``, then torch's own close reaps them. A recipe's ranks on
CPU start warm instead: forked from a forkserver that imported torch once (launcher/backends/warm_start.py). Imports
torch: the backends import it only when they start a job."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, PContext, Std, start_processes
from torch.distributed.elastic.multiprocessing.api import SubprocessContext

from launcher import lifeline
from launcher.backends.processes import stop_process_groups
from launcher.plan import RunPlan
from launcher.rundir import RunDir

__all__ = ["LocalJob", "RankLogsSpecs", "local_ranks", "spawn_ranks"]


class RankLogsSpecs(LogsSpecs):
    """``<run_dir>/rank.<RANK>/{stdout,stderr,error.json}``: one folder per global rank, one attempt per run."""

    def __init__(self, run_dir: RunDir) -> None:
        super().__init__(log_dir=str(run_dir.path), redirects=Std.ALL, tee=Std.NONE)
        self._run_dir = run_dir

    @property
    def root_log_dir(self) -> str:
        return str(self._run_dir.path)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Called by start_processes; like DefaultLogsSpecs it also tells each rank its error file via envs."""
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank_dir = self._run_dir.rank(int(env["RANK"]))
            rank_dir.path.mkdir(parents=True, exist_ok=True)
            dest.stdouts[local_rank] = str(rank_dir.stdout)
            dest.stderrs[local_rank] = str(rank_dir.stderr)
            dest.error_files[local_rank] = str(rank_dir.error)
            env["TORCHELASTIC_ERROR_FILE"] = str(rank_dir.error)  # where @record in the worker writes
        return dest


def local_ranks(plan: RunPlan, envs: dict[int, dict[str, str]]) -> dict[int, int]:
    """local rank -> global rank of the ranks in envs (this host's)."""
    return {r.local_rank: r.rank for r in plan.ranks if r.rank in envs}


class _Forked:
    """A rank forked from the forkserver (a ``multiprocessing.Process``) as the ``subprocess.Popen`` that
    ``stop_process_groups`` and ``LocalJob`` read: pid, poll(), wait(timeout)."""

    def __init__(self, process) -> None:
        self._process, self.pid = process, process.pid

    def poll(self) -> int | None:
        return self._process.exitcode  # negative: the signal that ended it, as Popen's returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        return self._process.exitcode


def _processes(pc: PContext) -> dict[int, Any]:
    """local rank -> its process (Popen, or a forked one as _Forked) of either kind of torch elastic's PContext."""
    if isinstance(pc, SubprocessContext):
        return {local: h.proc for local, h in pc.subprocess_handlers.items()}
    return {local: _Forked(p) for local, p in enumerate(pc._pc.processes)}  # MultiprocessContext: torch's mp context


class LocalJob:
    """This host's ranks as torch elastic's processes (a ``job.RankJob``)."""

    def __init__(self, pc: PContext, by_local: dict[int, int]) -> None:
        self._pc, self._by_local = pc, by_local
        self._procs = _processes(pc)
        self.ranks = tuple(sorted(by_local.values()))

    def poll(self) -> dict[int, int]:
        return {self._by_local[local]: code for local, p in self._procs.items() if (code := p.poll()) is not None}

    def pids(self) -> dict[int, int]:
        return {self._by_local[local]: p.pid for local, p in self._procs.items()}

    def stop(self) -> None:
        stop_process_groups(list(self._procs.values()))
        self._pc.close(death_sig=signal.SIGKILL, timeout=1)  # reaps the ranks and closes their log files


def spawn_ranks(plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]]) -> LocalJob:
    """Start this host's ranks (those in envs) as ``python <plan.rank_args(run_dir)>``, each tied to this process's
    life; warm (forked from the forkserver) where the plan says so."""
    by_local = local_ranks(plan, envs)
    local_envs = {local: dict(envs[rank]) for local, rank in by_local.items()}
    from launcher.backends.warm_start import start_warm, stop_forkserver

    if getattr(plan, "warm_start", False):
        return LocalJob(start_warm(run_dir.name, str(run_dir.path), local_envs, RankLogsSpecs(run_dir)), by_local)
    stop_forkserver()  # an earlier warm run's (a sweep's), idle now
    # each rank dies with this process (lifeline: the kernel's parent-death signal), then runs python <rank args>
    args = tuple(lifeline.command(os.getpid(), signal.SIGKILL, [sys.executable, *plan.rank_args(str(run_dir.path))]))
    pc = start_processes(
        name=run_dir.name,
        entrypoint=args[0],
        args={local: args[1:] for local in by_local},
        envs=local_envs,
        logs_specs=RankLogsSpecs(run_dir),
    )
    return LocalJob(pc, by_local)
