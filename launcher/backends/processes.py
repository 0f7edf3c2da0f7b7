"""Stopping a job's processes, the way every backend's ``RankJob.stop`` does it: SIGTERM to each rank's process
group (a rank and its children: data loader workers, compilers), SIGCONT so that a stopped rank can act on it,
SIGKILL after STOP_TIMEOUT_S, or at once on a second signal to the launcher (torch elastic's ``SignalException``,
or Ctrl-C). torch's ``SubprocessHandler`` stops a rank the same way (``os.killpg``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress

STOP_TIMEOUT_S = 10  # between SIGTERM and SIGKILL


def send_signals(pids: list[int], signals: tuple[int, ...], send=os.killpg) -> None:
    """Each signal to each pid, skipping the ones already gone. send: os.killpg (the default: each rank leads its own
    session and process group, as torch elastic starts them) or os.kill (one process)."""
    for pid in pids:
        for sig in signals:
            with suppress(ProcessLookupError, PermissionError):
                send(pid, sig)


def stop_process_groups(procs: list[subprocess.Popen]) -> None:
    """Each process's group: SIGTERM (and SIGCONT), SIGKILL after STOP_TIMEOUT_S or on a second signal.
    Processes that already ended are signalled too: their children may not have."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    pids = [p.pid for p in procs]
    send_signals(pids, (signal.SIGTERM,))
    send_signals(pids, (signal.SIGCONT,))
    with suppress(KeyboardInterrupt, SignalException):  # a second signal: no more grace
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in procs:
            with suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
    send_signals(pids, (signal.SIGKILL,))


def process_state(pid: int) -> str:
    """The kernel's one-letter state of pid ('' where /proc has none)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2]
    except (OSError, ValueError, IndexError):
        return ""


def wait_ended(pids: list[int], timeout_s: float = 10.0) -> None:
    """Return once none of pids runs (gone, or a zombie: ended, its parent yet to reap it); SIGKILL to each still
    running meanwhile. A rank whose starter was killed dies by its parent-death signal a moment later: the
    launcher must not return before."""
    deadline = time.monotonic() + timeout_s
    while (running := [p for p in pids if process_state(p) not in ("", "Z")]) and time.monotonic() < deadline:
        send_signals(running, (signal.SIGKILL,), os.kill)
        time.sleep(0.02)
