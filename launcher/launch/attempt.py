"""The attempts of a run: one loop (``run_attempts``) for every launch, each attempt on the world its source gives
(``World``: the plan's own hosts, launch/__init__.py; or an elastic rendezvous round, launch/elastic_agent.py); an
attempt spawns its ranks, supervises them (progress, watchdog) and judges how it ended (``run_attempt``).

A run with ``launcher.max_restarts`` > 0 may make several attempts in one run dir: before the next one starts, the
last one's rank dirs move to ``attempt.<k>/`` (``archive_attempt``), so no log is overwritten."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from rich.console import Console

from launcher.launch.blame import Ending, blame_reason, first_failure
from launcher.launch.nodes import NodeGroup
from launcher.backends.job import RankJob
from launcher.launch.supervise import Outcome
from launcher.lifeline import LAUNCHER_SIGNALS
from launcher.plan import RunPlan
from launcher.rundir import RunDir

StartJob = Callable[[RunPlan, RunDir, dict[int, dict[str, str]]], RankJob]
"""Starts an attempt's ranks: a backend's ``start`` with its JobConfig bound (``launcher.backends.job``)."""

STDERR_EVIDENCE_LINES = 30
"""How much of a failed rank's stderr the blame reads (with its error.json) to tell a lost peer from a cause."""


@dataclass(frozen=True)
class Attempt:
    number: int
    outcome: Outcome
    exits: list[dict]
    """Per global rank: rank, exit_code, stopped_by_launcher, first_failure, stalled (and the first failure's
    blame: why it was named)."""
    status: str
    """ok, failed, hung, interrupted, or admit (cluster.launch=elastic: stopped to admit a host waiting to join)."""
    first_failed: int | None
    """The global rank whose failure ended the attempt (blame.first_failure)."""
    resumed_from: str
    remote_failure: dict | None = None
    """cluster.launch=elastic: the failure every node names, when it happened on another node."""

    def record(self) -> dict:
        """The attempt in summary.json's ``attempts``."""
        rec = {"attempt": self.number, "status": self.status, "first_failed_rank": self.first_failed,
               "resumed_from": self.resumed_from or None,
               "exit_codes": {str(e["rank"]): e["exit_code"] for e in self.exits}}
        if self.outcome.stall is not None:
            rec["hung_ranks"] = list(self.outcome.stall.ranks)
        return rec


@dataclass
class Round:
    """One attempt's world: its plan, each rank's environment, how its ranks start, and (elastic) the node group
    whose failures stop this node's ranks too."""

    plan: RunPlan
    envs: dict[int, dict[str, str]]
    start_job: StartJob
    group: NodeGroup | None = None
    number: int | None = None
    """The attempt's number, when the round names it (elastic: the most any host made, so that a host that joined
    late counts on from the others); None: this launcher's count."""


class World(Protocol):
    """Where a run's attempts run: the source of each attempt's round."""

    run_dir: RunDir
    meets: bool
    """Its rounds are met at a rendezvous (an interrupt while meeting is the run's end, recorded); False: an
    interrupt before the first attempt is the caller's."""

    def next_round(self, number: int, last: Attempt | None) -> Round | None:
        """Attempt ``number``'s round (after ``last``); None: no next attempt (the source said why)."""

    def ran(self, attempt: Attempt) -> None:
        """After each attempt (its records)."""

    def again(self, attempt: Attempt, restarts_left: int) -> bool:
        """After an attempt that did not end the run: whether another may follow (and the clean-up before it)."""

    def interrupted(self, signum: int) -> None:
        """A signal came between two attempts (no rank runs)."""


def run_attempts(world: World, max_restarts: int, watchdog_s: float, console: Console, console_mode: str
                 ) -> list[Attempt]:
    """The run's attempts, until one ends ok or interrupted, or no restart is left (launcher.max_restarts; an
    attempt stopped to admit a waiting host may go on with none: the elastic round counts it against the rest)."""
    from launcher.launch.supervise import SignalException

    attempts: list[Attempt] = []
    while True:
        try:
            rnd = world.next_round(len(attempts), attempts[-1] if attempts else None)
        except (KeyboardInterrupt, SignalException) as e:
            if not attempts and not world.meets:
                raise
            signum = int(e.sigval if isinstance(e, SignalException) else signal.SIGINT)
            world.interrupted(signum)
            if attempts:
                attempts[-1] = dataclasses.replace(attempts[-1], status="interrupted", outcome=dataclasses.replace(
                    attempts[-1].outcome, interrupted=True, signal=signum))
            return attempts
        if rnd is None:
            return attempts
        left = max_restarts - len(attempts)  # restarts this launcher has left after this attempt
        number = len(attempts) if rnd.number is None else rnd.number
        attempt = run_attempt(rnd.plan, world.run_dir, rnd.envs, number, watchdog_s, console, rnd.group,
                              start_job=rnd.start_job, console_mode=console_mode)
        attempts.append(attempt)
        world.ran(attempt)
        if (attempt.status in ("ok", "interrupted") or (left <= 0 and attempt.status != "admit")
                or not world.again(attempt, left - 1)):
            return attempts


STOP_SIGNALS = (signal.SIGINT, *LAUNCHER_SIGNALS)


@contextmanager
def signals_held() -> Iterator[list[int]]:
    """A stop signal that comes while the ranks are being started is held back (the list given gets it), so that it
    stops a job that exists, through supervise, instead of leaving its started ranks behind a traceback; a second
    one is not held (a start that hangs can still be interrupted). A start that sets handlers of its own keeps them
    (torch elastic's PContext.start: from then on a signal raises in it, as before). Only the main thread handles
    signals."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def hold(signum: int, frame) -> None:
        if not held:
            held.append(signum)
        elif callable(before[signum]):
            before[signum](signum, frame)
        else:
            signal.default_int_handler(signum, frame)

    for s in STOP_SIGNALS:
        signal.signal(s, hold)
    try:
        yield held
    finally:
        for s, handler in before.items():
            if signal.getsignal(s) is hold:  # a start that set its own (torch elastic's PContext.start) keeps it
                signal.signal(s, handler)


def run_attempt(plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]], number: int, watchdog_s: float,
                console: Console, nodes: NodeGroup | None = None, *, start_job: StartJob,
                console_mode: str = "none") -> Attempt:
    """Start the ranks in envs (start_job: the backend's ``start`` with its JobConfig bound: torch elastic's
    processes on this host, one mpirun/srun, or another backend's own), supervise them (progress; output.console=console_mode: a script's rank output on the console), judge the end.
    With nodes (cluster.launch=elastic), a failure on another node stops this node's ranks too, and every node
    names the same first failure."""
    from launcher.launch.ops import RankBuildWatch
    from launcher.launch.progress import ProgressView
    from launcher.launch.quiet import QuietScriptWatch
    from launcher.launch.supervise import end_job_processes, supervise
    from launcher.launch.tee import RankTee, streamed_ranks
    from launcher.launch.watchdog import Watchdog

    with signals_held() as held:
        job = start_job(plan, run_dir, envs)
    try:  # until supervise has them: any error here stops the ranks first (a sweep goes on to its next job)
        watchdog = (Watchdog({r: run_dir.rank(r) for r in job.ranks}, job.pids, watchdog_s,
                             first_step=plan.kind != "script") if watchdog_s > 0 else None)
        tee = RankTee(console, run_dir, streamed_ranks(plan.kind, console_mode, job.ranks), console_mode == "all")
        builds = RankBuildWatch(plan, console)  # a rank compiling an op the launcher did not prebuild is announced
        quiet = QuietScriptWatch(run_dir, job.pids, watchdog_s if plan.kind == "script" else 0, console)
    except BaseException:
        job.stop()
        end_job_processes(str(run_dir.path.resolve()))
        raise
    other_failed = nodes.should_stop if nodes is not None else None  # a failure elsewhere, or a host to admit
    with ProgressView(console, run_dir.rank(min(job.ranks)), plan.steps) as view:

        def tick() -> None:
            tee.tick()
            view.tick()
            builds.tick()
            quiet.tick()

        outcome = supervise(job, tick, watchdog, other_failed, run_dir=str(run_dir.path.resolve()),
                            interrupted_by=held[0] if held else None)
        tee.drain()  # the ranks are reaped: the rest of their output, before the bar's last state
    endings = _endings(run_dir, outcome, plan)
    blamed = first_failure(endings)
    remote = None
    if nodes is not None and (blamed is not None or outcome.stopped_for_another_node):
        local = _failure_record(run_dir, blamed) if blamed is not None else None
        remote = nodes.publish_failure(local, blamed.lost_peer) if local is not None else nodes.round_end()
        if remote is not None and "admit" in remote:
            blamed = None  # the round ended to admit a host: what failed here was stopped by it
        elif remote is not None and remote.get("node") == nodes.node_rank:
            remote = None  # this node's own failure is the one every node names
        elif remote is not None:
            blamed = None
    stalled = set(outcome.stall.ranks) if outcome.stall is not None else set()
    lost = {e.rank for e in endings if e.lost_peer}
    exits = [{"rank": e.rank, "exit_code": e.exit_code, "stopped_by_launcher": e.stopped_by_launcher,
              "first_failure": blamed is not None and e.rank == blamed.rank, "stalled": e.rank in stalled,
              "lost_peer": e.rank in lost} for e in outcome.exits]
    if blamed is not None:  # why this rank, by which evidence (summary.json, the failure report)
        next(x for x in exits if x["rank"] == blamed.rank)["blame"] = blame_reason(blamed, endings)
    admitted = remote is not None and "admit" in remote
    if outcome.interrupted:
        status = "interrupted"
    elif admitted:
        status = "admit"
    elif outcome.stall is not None:
        status = "hung"
    else:
        status = "ok" if all(e["exit_code"] == 0 for e in exits) and remote is None else "failed"
    first = (None if admitted else remote["rank"]) if remote is not None else (
        blamed.rank if blamed is not None else None)
    return Attempt(number=number, outcome=outcome, exits=exits, status=status, first_failed=first,
                   resumed_from=getattr(plan, "resume_from", ""), remote_failure=remote)


def _failure_record(run_dir: RunDir, blamed: Ending) -> dict:
    """What the other nodes are told of this node's first failure (cluster.launch=elastic)."""
    from launcher.report.summary import signal_name

    rank_dir = run_dir.rank(blamed.rank)
    return {"rank": blamed.rank, "exit_code": blamed.exit_code, "signal": signal_name(blamed.exit_code),
            "last_step": blamed.last_step or 0, "error": rank_dir.error_message()[:500]}


def _endings(run_dir: RunDir, outcome: Outcome, plan: RunPlan) -> list[Ending]:
    """The evidence of each rank that ended on its own: exit code, when the launcher saw it gone, when it ended by its
    exit record (mpirun or srun) if that was written on this host, when it wrote its error (error.json's mtime, the
    file system's clock), what it said, its last step and the plan's (a recipe's). Each time stays on its own clock:
    blame compares like with like."""
    from launcher.report.log_tail import MESSAGE_CHARS, cut_middle, log_tail

    host = socket.gethostname()
    planned = plan.steps if getattr(plan, "kind", "") != "script" and plan.steps > 0 else None
    out = []
    for e in outcome.ended_on_their_own:
        rank_dir = run_dir.rank(e.rank)
        try:
            error_s = os.stat(rank_dir.error).st_mtime_ns / 1e9
        except OSError:
            error_s = None
        record, pid = rank_dir.read_exit(), rank_dir.read_pid()
        here = record is not None and pid is not None and pid[0] == host  # its exit record's time is this host's clock
        exit_s = record["time"] if here and isinstance(record.get("time"), (int, float)) else None
        said = ([cut_middle(rank_dir.error_message(), MESSAGE_CHARS), *log_tail(rank_dir.stderr, STDERR_EVIDENCE_LINES)]
                if e.exit_code != 0 else [])  # (a clean exit's words are no evidence of a lost peer)
        out.append(Ending(rank=e.rank, exit_code=e.exit_code, seen_s=e.seen_s, error_s=error_s, error="\n".join(said),
                          exit_s=exit_s, last_step=rank_dir.recorded_step(), planned_steps=planned))
    return out


def archive_attempt(run_dir: RunDir, number: int, ranks: list[int]) -> None:
    """Move attempt ``number``'s rank dirs (and the plan it ran) to ``attempt.<number>/``: the next attempt starts
    with empty rank dirs, and nothing is overwritten."""
    dest = run_dir.attempt(number)
    dest.path.mkdir()
    for rank in ranks:
        src = run_dir.rank(rank).path
        if src.exists():
            os.replace(src, dest.rank(rank).path)
    if run_dir.plan.exists():
        dest.plan.write_bytes(run_dir.plan.read_bytes())
