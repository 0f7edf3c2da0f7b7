"""Watch the ranks until all finish, one fails, one hangs or the launcher is signalled; then stop the rest and say
who did what.

The launcher polls each rank's process itself (every ``period_s``), so it knows which ranks ended *before* it sent
any signal: only those can have caused the failure (``blame.first_failure`` picks among them by evidence). Stopping
is SIGTERM to every rank's process group (a rank and its children: data loader workers, compilers), SIGCONT so that
a stopped rank can act on it, SIGKILL after STOP_TIMEOUT_S, or at once on a second signal to the launcher: each
backend's job does it with ``launcher.backends.processes`` (re-exported here), and the job is a
``launcher.backends.job.RankJob`` whichever backend started it.

A signal to the launcher (Ctrl-C, ``kill``) stops every rank the same way: torch elastic turns SIGINT, SIGTERM,
SIGHUP and SIGQUIT into ``SignalException`` once the ranks are started (``launch_run`` does the same before)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException

from launcher.backends.job import RankJob
from launcher.backends.processes import STOP_TIMEOUT_S, process_state, send_signals, stop_process_groups
from launcher.backends.warm_start import forkserver_pid
from launcher.launch.watchdog import Stall, Watchdog
from launcher.lifeline import FORKSERVER_PARENT_ENV
from launcher.rundir import RUN_DIR_ENV

__all__ = ["STOP_TIMEOUT_S", "FAILURE_GRACE_S", "Outcome", "RankExit", "RankJob", "SignalException",
           "end_job_processes", "job_processes", "send_signals", "stop_process_groups", "supervise"]

FAILURE_GRACE_S = 0.5
"""After the first failure, how long the other ranks may still end on their own before they are stopped: a rank that
left with exit 0 just before its peer failed (its interpreter still ending) is then seen leaving, and blamed."""


@dataclass(frozen=True)
class RankExit:
    rank: int
    """The global rank."""
    exit_code: int | None
    """None while unknown (the launcher was interrupted before the rank ended)."""
    stopped_by_launcher: bool
    """True for ranks that were still running when the launcher stopped the job."""
    seen_s: float | None
    """When the launcher saw a rank that ended on its own gone (its monotonic clock); None for the ones it stopped."""


@dataclass(frozen=True)
class Outcome:
    exits: tuple[RankExit, ...]
    interrupted: bool
    signal: int | None = None
    """The signal that interrupted the launcher (SIGINT for Ctrl-C); the exit code is 128 + it."""
    stall: Stall | None = None
    """The watchdog's finding, when the job hung."""
    stopped_for_another_node: bool = False
    """The ranks were stopped because a rank on another node failed (cluster.launch=elastic)."""

    @property
    def ended_on_their_own(self) -> list[RankExit]:
        return [e for e in self.exits if not e.stopped_by_launcher and e.exit_code is not None]


def job_processes(run_dir: str) -> list[int]:
    """This host's processes of the run at run_dir (besides this one), zombies left out: those whose environment
    names the run dir (the ranks and every process they start by exec; RUN_DIR_ENV), whose command line starts
    rank_start on it (mpirun, srun, rank_start; not a user's `tail -f` of a log there), and every process forked from
    this launcher's warm-start forkserver but the forkserver itself: a forked process's environment, as /proc shows
    it, is the forkserver's, which names no run dir but this launcher (``FORKSERVER_PARENT_ENV``), and the launcher's
    runs come one after another (launcher/backends/warm_start.py)."""
    env_entry = f"{RUN_DIR_ENV}={run_dir}\0".encode()
    starter = f"launcher.backends.rank_start\0{run_dir}\0".encode()
    forked = f"{FORKSERVER_PARENT_ENV}={os.getpid()}\0".encode()
    spared = {os.getpid(), forkserver_pid()}
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid in spared:
            continue
        try:
            environ = (proc / "environ").read_bytes()
            if (env_entry not in environ and forked not in environ
                    and starter not in (proc / "cmdline").read_bytes()):
                continue
        except OSError:  # gone, or not ours to read
            continue
        if process_state(pid) not in ("", "Z"):  # '': gone meanwhile
            found.append(pid)
    return found


def end_job_processes(run_dir: str, timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
    """Return once no process of the run is left on this host (SIGKILL to the stragglers: a rank's child, an mpirun
    that lingers), or after timeout_s; the pids still running then (none, when the kernel kept its word)."""
    deadline = time.monotonic() + timeout_s
    while (left := job_processes(run_dir)) and time.monotonic() < deadline:
        send_signals(left, (signal.SIGKILL,), os.kill)
        time.sleep(0.05)
    return left


def supervise(job: RankJob, on_tick: Callable[[], None], watchdog: Watchdog | None = None,
              other_node_failed: Callable[[], bool] | None = None, period_s: float = 0.05,
              run_dir: str | None = None, interrupted_by: int | None = None) -> Outcome:
    """Poll the ranks every period_s, calling on_tick (progress) each time, until the run is over (or, with
    other_node_failed, until it says another node's rank failed). With run_dir (the resolved path), return only
    once no process of that run is left on this host. ``interrupted_by``: a signal that came while the ranks were
    being started (held back until they were: launcher/launch/attempt.py): they are stopped at once."""
    seen: dict[int, tuple[int, float]] = {}  # rank -> (exit code, when seen) for ranks that ended on their own
    signum, stall, remote, failed_at = interrupted_by, None, False, None
    try:
        while signum is None:
            now = time.monotonic()
            for rank, code in job.poll().items():
                seen.setdefault(rank, (code, now))
            on_tick()
            if failed_at is None and any(code != 0 for code, _ in seen.values()):
                failed_at = now  # ranks already on their way out (an early exit 0 still ending) end on their own
            if len(seen) == len(job.ranks) or (failed_at is not None and now - failed_at >= FAILURE_GRACE_S):
                break
            if failed_at is not None:
                time.sleep(period_s)
                continue
            if watchdog is not None:
                stall = watchdog.check({r for r in job.ranks if r not in seen})
                if stall is not None:
                    break
            if other_node_failed is not None and other_node_failed():
                remote = True
                break
            time.sleep(period_s)
    except KeyboardInterrupt:
        signum = signal.SIGINT
    except SignalException as e:
        signum = e.sigval
    finally:
        job.stop()  # also when all ended: a rank's leftover children go with it
        if run_dir is not None:
            end_job_processes(run_dir)  # the launcher never returns while a process of its job runs here
    last = job.poll()
    exits = []
    for rank in sorted(job.ranks):
        code, seen_s = seen.get(rank, (last.get(rank), None))
        exits.append(RankExit(rank=rank, exit_code=code, stopped_by_launcher=rank not in seen, seen_s=seen_s))
    return Outcome(exits=tuple(exits), interrupted=signum is not None,
                   signal=int(signum) if signum is not None else None, stall=stall, stopped_for_another_node=remote)
