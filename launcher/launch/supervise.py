"""Watch the ranks until all finish or one fails; then stop the rest (SIGTERM, then SIGKILL) and say who did what.

A signal to the launcher (Ctrl-C, ``kill``) stops every rank the same way: torch elastic turns SIGINT, SIGTERM, SIGHUP
and SIGQUIT into ``SignalException`` once the ranks are started (``launch_run`` does the same before), and a second
signal while the ranks are being stopped escalates to SIGKILL."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.elastic.multiprocessing import PContext
from torch.distributed.elastic.multiprocessing.api import SignalException

STOP_TIMEOUT_S = 10  # between SIGTERM and SIGKILL


@dataclass(frozen=True)
class RankExit:
    local_rank: int
    exit_code: int | None
    """None while unknown (the launcher was interrupted before the rank ended)."""
    stopped_by_launcher: bool
    """True for ranks the launcher stopped because another rank failed (or the user interrupted)."""


@dataclass(frozen=True)
class Outcome:
    exits: tuple[RankExit, ...]
    first_failed: int | None
    """Local rank whose failure ended the run, if any."""
    interrupted: bool
    signal: int | None = None
    """The signal that interrupted the launcher (SIGINT for Ctrl-C); the exit code is 128 + it."""


def _stop(pc: PContext) -> None:
    """SIGTERM to every rank's process group, SIGKILL after STOP_TIMEOUT_S; a second signal meanwhile: SIGKILL now."""
    try:
        pc.close(death_sig=signal.SIGTERM, timeout=STOP_TIMEOUT_S)
    except (KeyboardInterrupt, SignalException):
        pc.close(death_sig=signal.SIGKILL, timeout=1)


def supervise(pc: PContext, nprocs: int, on_tick: Callable[[], None], period_s: float = 0.1) -> Outcome:
    """Poll the ranks every period_s, calling on_tick (progress) each time, until the run is over."""
    signum = None
    result = None
    try:
        while result is None:
            result = pc.wait(timeout=0)  # one poll; on any failure it also stops the other ranks
            on_tick()
            if result is None:
                time.sleep(period_s)
    except KeyboardInterrupt:
        signum = signal.SIGINT
    except SignalException as e:
        signum = e.sigval
    finally:
        if result is None:
            _stop(pc)
    interrupted = signum is not None
    failures = result.failures if result is not None else {}
    first = None
    if failures:
        # The rank that failed first is the earliest failure that the launcher did not cause itself.
        own = [f for f in failures.values() if f.exitcode not in (-signal.SIGTERM, -signal.SIGKILL)]
        first = min(own or failures.values(), key=lambda f: f.timestamp).local_rank
    exits = []
    for local_rank in range(nprocs):
        if local_rank in failures:
            code = failures[local_rank].exitcode
        elif result is not None:
            code = 0
        else:
            code = _returncode(pc, local_rank)
        stopped = (first is not None and local_rank != first and local_rank in failures) or interrupted
        exits.append(RankExit(local_rank=local_rank, exit_code=code, stopped_by_launcher=stopped))
    return Outcome(exits=tuple(exits), first_failed=first, interrupted=interrupted,
                   signal=int(signum) if signum is not None else None)


def _returncode(pc: PContext, local_rank: int) -> int | None:
    handlers = getattr(pc, "subprocess_handlers", {})
    handler = handlers.get(local_rank)
    return handler.proc.poll() if handler is not None else None
