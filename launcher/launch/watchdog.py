"""Name a hung rank: heartbeats that stop moving, the rank's process state, and every rank's Python stacks.

Each rank rewrites its heartbeat (``rank.N/last_step``) as it finishes steps and evaluation batches. When one has not
moved for the limit (``launcher.watchdog_s``, or 10 of the slowest step seen if that is longer), the job is stalled.
Before its first heartbeat a recipe's rank (whose trainer always beats; a script may never) may take FIRST_STEP_LIMITS
limits from the job's start: the first step is legitimately slower. A rank writing a checkpoint says so in its heartbeat
(``"state": "saving"``), which a thread keeps moving while the save runs: a save longer than the limit is not a hang,
but one longer than SAVE_LIMITS limits is (a collective inside it may hang while the thread beats on), and so is a
saving rank whose heartbeat stops (its process stopped). In a stalled data-parallel job every rank stops: the stuck
one, and its peers waiting for it inside a collective. The stuck ones are named by evidence, in this order:

1. a process the kernel has stopped (SIGSTOP, a debugger) or holds in uninterruptible I/O (state D);
2. a rank that does not answer the request for its stacks (STACKS_SIGNAL, faulthandler in the rank);
3. the ranks at the lowest step, when the steps differ;
4. the ranks whose stacks are not inside torch.distributed (the others wait in a collective for them);
5. else every stalled rank (a deadlock among collectives: the stacks tell which)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from launcher.backends.processes import process_state
from launcher.rundir import STACKS_SIGNAL, RankDir

SLOW_STEPS = 10
"""The limit is at least this many of the slowest observed step."""
SAVE_LIMITS = 12
"""A checkpoint save may run this many limits in all (an hour at the default 300 s) while its heartbeat moves."""
FIRST_STEP_LIMITS = 12
"""Limits a recipe's rank may take to its first finished step, counted from when its job started: an hour at the
default 300 s, as a save. Besides a step, the first one builds the model and its optimizer, meets its peers
(``init_process_group``), reads the first data (a file's first shard, a loader's workers started), loads a checkpoint
on resume and compiles what the run compiles (DeepSpeed's ops a rank builds itself, torch.compile): minutes where a
step takes milliseconds. Measured on a loaded 2-core machine: tens of seconds for a smoke run's ranks, under 12 of
the smallest limit any test sets (2 s)."""
STACKS_WAIT_S = 3.0
"""How long the ranks get to write their stacks."""
_STATES = {"T": "stopped (SIGSTOP or a debugger)", "t": "stopped by a debugger", "D": "in uninterruptible I/O (D)",
           "Z": "exited, not reaped", "R": "running", "S": "sleeping (waiting)"}
_STACK_HEADER = "most recent call first"
WAITING_IN = ("torch/distributed/", "torch/autograd/")
"""Where a stack shows a rank waiting in a collective: torch.distributed's calls, or a backward, where DDP's and
FSDP's gradient collectives run (in the autograd engine, below any Python frame of theirs)."""
ENTRY = "torch/distributed/elastic/"
"""torch elastic's entry wrapper (``record``), at the bottom of every rank's stack: no collective."""


def _waits(stack: str) -> bool:
    """The stacks show a frame in a collective or a backward (WAITING_IN), torch elastic's entry wrapper apart."""
    return any(w in line and ENTRY not in line for line in stack.splitlines() for w in WAITING_IN)


@dataclass(frozen=True)
class Stall:
    ranks: tuple[int, ...]
    """The ranks named as stuck."""
    why: str
    """Which evidence named them."""
    steps: dict[int, int]
    """Every watched rank's last finished step."""
    idle_s: float
    """The longest any running rank's heartbeat had not moved (what crossed the limit)."""
    limit_s: float
    states: dict[int, str]
    """Each rank's process state, in words."""
    stacks: dict[int, str]
    """Each rank's dumped stacks ('' = it did not answer)."""
    saving: dict[int, float]
    """The ranks that were writing a checkpoint, and for how long (s)."""
    first_step: bool = False
    """The named ranks had not finished their first step (no heartbeat yet): the limit was FIRST_STEP_LIMITS limits
    from the job's start."""

    def to_dict(self) -> dict:
        return {"ranks": list(self.ranks), "why": self.why, "steps": {str(k): v for k, v in self.steps.items()},
                "idle_s": round(self.idle_s, 1), "limit_s": round(self.limit_s, 1),
                "states": {str(k): v for k, v in self.states.items()},
                "saving_s": {str(k): round(v, 1) for k, v in self.saving.items()}, "before_first_step": self.first_step}


class Watchdog:
    """check() every supervision poll; it reads the heartbeats at most every ``period_s``."""

    def __init__(self, rank_dirs: dict[int, RankDir], pids: Callable[[], dict[int, int]], watchdog_s: float,
                 period_s: float = 0.5, first_step: bool = True) -> None:
        """Made as the job starts. pids: each rank's process on this host, asked when a stall is diagnosed (a rank
        under mpirun or srun writes its pid once started; one on another host has none: it is not asked for stacks).
        first_step: bound the time to each rank's first heartbeat (FIRST_STEP_LIMITS); not for a script's ranks,
        which beat only if they log through the runtime."""
        self._started = time.monotonic() if first_step else None
        self._dirs, self._pids, self._base, self._period = rank_dirs, pids, watchdog_s, period_s
        self._beat: dict[int, tuple[dict, float]] = {}  # rank -> (its heartbeat, when the launcher saw it change)
        self._saving: dict[int, tuple[int, float]] = {}  # rank -> (the step it saves, when the launcher saw it begin)
        self._slowest_step_s = 0.0
        self._checked = 0.0

    @property
    def limit_s(self) -> float:
        return max(self._base, SLOW_STEPS * self._slowest_step_s)

    def check(self, running: set[int]) -> Stall | None:
        """A Stall when a running rank's heartbeat has not moved for limit_s, or its checkpoint save has run for
        SAVE_LIMITS × limit_s (then the ranks' stacks are asked for: this takes up to STACKS_WAIT_S), else None.
        ``running``: the ranks that have not ended."""
        now = time.monotonic()
        if self._base <= 0 or now - self._checked < self._period:
            return None
        self._checked = now
        for rank in running:
            beat = self._dirs[rank].read_heartbeat()
            if not beat:
                continue
            old = self._beat.get(rank)
            if old is None or old[0] != beat:
                if old is not None and beat.get("step", 0) > old[0].get("step", 0):
                    per_step = (now - old[1]) / (beat["step"] - old[0]["step"])
                    self._slowest_step_s = max(self._slowest_step_s, per_step)
                self._beat[rank] = (beat, now)
            self._note_save(rank, beat, now)
        watched = running if self._started is not None else running & self._beat.keys()
        overdue = {r: self._overdue(r, now) for r in watched}
        if not any(idle >= limit for idle, limit in overdue.values()):
            return None
        return self._diagnose(running, overdue, now)

    def _note_save(self, rank: int, beat: dict, now: float) -> None:
        """When the rank's save began: the first time its heartbeat said "saving" at this step (saves are at
        distinct steps, so back-to-back saves whose steps in between went unseen are not added up)."""
        if beat.get("state") != "saving":
            self._saving.pop(rank, None)
        elif rank not in self._saving or self._saving[rank][0] != beat.get("step"):
            self._saving[rank] = (beat.get("step", 0), now)

    def _overdue(self, rank: int, now: float) -> tuple[float, float]:
        """(how long the rank has made no progress, the limit that applies): since its heartbeat last moved
        (limit_s); for a rank writing a checkpoint also since its save began (SAVE_LIMITS × limit_s), whichever is
        nearer its limit; before its first heartbeat, since the job started (FIRST_STEP_LIMITS × limit_s)."""
        if rank not in self._beat:
            return now - self._started, FIRST_STEP_LIMITS * self.limit_s
        idle = (now - self._beat[rank][1], self.limit_s)
        if rank not in self._saving:
            return idle
        return max(idle, (now - self._saving[rank][1], SAVE_LIMITS * self.limit_s), key=lambda t: t[0] / t[1])

    def _diagnose(self, running: set[int], overdue: dict[int, tuple[float, float]], now: float) -> Stall:
        stalled = sorted(r for r, (idle, limit) in overdue.items() if idle >= limit)
        idle_s, limit_s = max(overdue.values(), key=lambda t: t[0] / t[1])
        pids = self._pids()
        states = {r: process_state(pids[r]) if r in pids else "" for r in sorted(running)}
        stacks = self.ask_for_stacks(sorted(running), pids)
        steps = {r: self._beat[r][0].get("step", 0) if r in self._beat else 0 for r in sorted(overdue)}
        low = min(steps.values()) if steps else 0
        outside = [r for r in stalled if stacks[r] and not _waits(stacks[r])]
        for ranks, why in (
            ([r for r in sorted(running) if states[r] in ("T", "t", "D")], "its process state"),
            ([r for r in sorted(running) if r in pids and not stacks[r]], "its silence: it did not answer the request for its stacks"),
            ([r for r in stalled if steps.get(r, low) == low] if len(set(steps.values())) > 1 else [],
             "its step: it is behind the others"),
            (outside if len(outside) < len(stalled) else [], "its stack: outside torch.distributed and backward while "
                                                             "the others wait in a collective"),
            (stalled, "elimination: no rank made progress (a deadlock? see the stacks)"),
        ):
            if ranks:
                break
        return Stall(ranks=tuple(ranks), why=why, steps=steps, idle_s=idle_s, limit_s=limit_s,
                     states={r: _STATES.get(s, s or "unknown") for r, s in states.items()}, stacks=stacks,
                     saving={r: now - t for r, (_, t) in sorted(self._saving.items()) if r in running},
                     first_step=not any(r in self._beat for r in ranks))

    def ask_for_stacks(self, ranks: list[int], pids: dict[int, int]) -> dict[int, str]:
        """Send STACKS_SIGNAL to each rank with a pid here, wait up to STACKS_WAIT_S for each to write its stacks
        to its stderr, and return what each wrote ('' for a rank that did not, or was not asked)."""
        asked = [r for r in ranks if r in pids]
        start = {}
        for r in asked:
            try:
                start[r] = self._dirs[r].stderr.stat().st_size
            except OSError:
                start[r] = 0
            with suppress(ProcessLookupError):
                os.kill(pids[r], STACKS_SIGNAL)
        out = {r: "" for r in ranks}
        deadline = time.monotonic() + STACKS_WAIT_S
        while asked and time.monotonic() < deadline:
            for r in asked:
                if not out[r]:
                    out[r] = _new_stacks(self._dirs[r].stderr, start[r])
            if all(out[r] for r in asked):
                break
            time.sleep(0.1)
        if any(out.values()):
            time.sleep(0.2)  # let a dump in progress finish
            out.update({r: _new_stacks(self._dirs[r].stderr, start[r]) for r in asked})
        return out


def _new_stacks(stderr: Path, offset: int) -> str:
    try:
        with open(stderr, errors="replace") as f:
            f.seek(offset)
            text = f.read()
    except OSError:
        return ""
    return text if _STACK_HEADER in text else ""
