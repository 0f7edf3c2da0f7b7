"""Watch the ranks until all finish, one fails, one hangs or the launcher is signalled; then stop the rest and say
who did what.

The launcher polls each rank's process itself (every ``period_s``), so it knows which ranks ended *before* it sent
any signal: only those can have caused the failure (``blame.first_failure`` picks among them by evidence). Stopping
is SIGTERM to every rank's process group (a rank and its children: data loader workers, compilers), SIGCONT so that
a stopped rank can act on it, SIGKILL after STOP_TIMEOUT_S, or at once on a second signal to the launcher.

A signal to the launcher (Ctrl-C, ``kill``) stops every rank the same way: torch elastic turns SIGINT, SIGTERM,
SIGHUP and SIGQUIT into ``SignalException`` once the ranks are started (``launch_run`` does the same before)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch.distributed.elastic.multiprocessing.api import SignalException

from launcher.launch.watchdog import Stall, Watchdog

STOP_TIMEOUT_S = 10  # between SIGTERM and SIGKILL


class RankJob(Protocol):
    """The ranks of one attempt on this host, however they were started (engine.LocalJob: torch elastic's
    processes; external.ExternalJob: under mpirun or srun)."""

    ranks: tuple[int, ...]
    """The global ranks this launcher watches."""

    def poll(self) -> dict[int, int]:
        """The exit code of each rank that has ended (global rank -> code; negative: killed by that signal)."""

    def pids(self) -> dict[int, int]:
        """The process of each rank on this host (the watchdog asks them for stacks)."""

    def stop(self) -> None:
        """Stop every rank (SIGTERM, SIGKILL after STOP_TIMEOUT_S or on a second signal) and reap them."""


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


def send_signals(pids: list[int], signals: tuple[int, ...], send=os.killpg) -> None:
    """Each signal to each pid, skipping the ones already gone. send: os.killpg (the default: each rank leads its own
    session and process group, as torch elastic starts them) or os.kill (one process)."""
    for pid in pids:
        for sig in signals:
            try:
                send(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def stop_process_groups(procs: list[subprocess.Popen]) -> None:
    """Each process's group: SIGTERM (and SIGCONT), SIGKILL after STOP_TIMEOUT_S or on a second signal.
    Processes that already ended are signalled too: their children may not have."""
    pids = [p.pid for p in procs]
    send_signals(pids, (signal.SIGTERM,))
    send_signals(pids, (signal.SIGCONT,))
    try:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    except (KeyboardInterrupt, SignalException):
        pass  # a second signal: no more grace
    send_signals(pids, (signal.SIGKILL,))


def supervise(job: RankJob, on_tick: Callable[[], None], watchdog: Watchdog | None = None,
              other_node_failed: Callable[[], bool] | None = None, period_s: float = 0.05) -> Outcome:
    """Poll the ranks every period_s, calling on_tick (progress) each time, until the run is over (or, with
    other_node_failed, until it says another node's rank failed)."""
    seen: dict[int, tuple[int, float]] = {}  # rank -> (exit code, when seen) for ranks that ended on their own
    signum, stall, remote = None, None, False
    try:
        while True:
            now = time.monotonic()
            for rank, code in job.poll().items():
                seen.setdefault(rank, (code, now))
            on_tick()
            if len(seen) == len(job.ranks) or any(code != 0 for code, _ in seen.values()):
                break
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
    last = job.poll()
    exits = []
    for rank in sorted(job.ranks):
        code, seen_s = seen.get(rank, (last.get(rank), None))
        exits.append(RankExit(rank=rank, exit_code=code, stopped_by_launcher=rank not in seen, seen_s=seen_s))
    return Outcome(exits=tuple(exits), interrupted=signum is not None,
                   signal=int(signum) if signum is not None else None, stall=stall, stopped_for_another_node=remote)
