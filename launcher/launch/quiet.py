"""Says on the console when a ``script=`` job waits without a sign of life: no rank on this host has written a line or
used the CPU for the watchdog's limit (``launcher.watchdog_s``).

A recipe's ranks beat a heartbeat the watchdog bounds (launcher/launch/watchdog.py); a script's ranks beat only if the
script logs through ``launcher.runtime``, so a script whose ranks never meet (``init_process_group`` with a world size
or rank of its own, or after a peer exited) waited in silence until torch's own timeout (30 minutes for a process
group). The launcher does not stop such a job (a script may wait for a reason of its own): it says what it sees,
once per quiet spell, with what to check. The ranks are not signalled: it reads their output files and their CPU time
in /proc."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from rich.console import Console

from launcher.rundir import RunDir

IDLE_CPU = 0.02
"""A rank whose CPU time grew by less than this fraction of the spell is waiting, not working."""


def cpu_seconds(pids: dict[int, int]) -> dict[int, float]:
    """Each live rank's user + system CPU time (s), from one pass over /proc: with its session's processes where the
    rank leads one (as torch elastic starts it: its DataLoader workers count), else its own; a rank that has ended
    is not in it."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    own: dict[int, tuple[int, float]] = {}  # pid -> (its session, its CPU)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, IndexError, ValueError):
            fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                own[int(stat.parent.name)] = (int(fields[3]), (int(fields[11]) + int(fields[12])) / tick)
    session: dict[int, float] = {}
    for sid, cpu in own.values():
        session[sid] = session.get(sid, 0.0) + cpu
    return {rank: session[pid] if own[pid][0] == pid else own[pid][1] for rank, pid in pids.items() if pid in own}


class QuietScriptWatch:
    """``tick()`` with the progress tick; samples every ``every_s``."""

    def __init__(self, run_dir: RunDir, pids: Callable[[], dict[int, int]], limit_s: float, console: Console,
                 every_s: float = 1.0) -> None:
        """``pids``: each rank's process on this host (the job's); ``limit_s``: the quiet spell to say (0: never)."""
        self._run, self._pids, self._limit = run_dir, pids, limit_s
        self._console, self._every = console, every_s
        self._next = 0.0
        self._since: tuple[float, dict[int, int], dict[int, float]] | None = None  # when, output sizes, CPU times
        self.said = 0
        self._told = -1.0  # the start of the spell last said

    def tick(self) -> None:
        now = time.monotonic()
        if self._limit <= 0 or now < self._next:
            return
        self._next = now + self._every
        pids = self._pids()
        cpu = cpu_seconds(pids)
        out = {r: self._output(r) for r in sorted(pids)}
        if self._since is None or out != self._since[1] or set(cpu) != set(self._since[2]) or any(
                cpu[r] - self._since[2][r] > IDLE_CPU * (now - self._since[0]) for r in cpu):
            self._since = (now, out, cpu)
            return
        if now - self._since[0] < self._limit or not cpu or self._told == self._since[0]:
            return
        self.said += 1
        self._told = self._since[0]  # said once per quiet spell
        ended = [r for r in sorted(pids) if r not in cpu]
        gone = f" Ranks {', '.join(map(str, ended))} have ended." if ended else ""
        self._console.print(
            f"[yellow]no rank of this script has written a line or used the CPU for {self._limit:g} s (launcher."
            f"watchdog_s): ranks {', '.join(map(str, sorted(cpu)))} wait.{gone} Ranks that wait in "
            f"init_process_group never met: the job has {len(pids)} ranks here, and the script must take "
            f"its rank and world size from the environment (RANK, WORLD_SIZE; env:// does), every rank calling it. "
            f"torch ends such a wait after its process group timeout (30 min by default); Ctrl-C stops the job "
            f"now (py-spy dump --pid <pid> shows where a rank waits).[/yellow]", soft_wrap=True)

    def _output(self, rank: int) -> int:
        size = 0
        for path in (self._run.rank(rank).stdout, self._run.rank(rank).stderr):
            with suppress(OSError):
                size += path.stat().st_size
        return size
