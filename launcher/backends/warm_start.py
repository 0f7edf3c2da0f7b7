"""Recipe ranks on CPU started warm: torch elastic's function entrypoint through Python's forkserver.

A fresh ``python -m launcher.worker`` spends most of a short run importing: on a 2-core machine ~4 s of CPU a rank
(torch, then torch._dynamo, which every torch optimizer imports when it is built), against ~1 s of training in a
smoke run. Here the imports happen once per run: ``multiprocessing``'s forkserver (a fresh interpreter, started by
this launcher) imports ``launcher.worker.warm`` and forks every rank from that state; torch elastic's
``start_processes`` with a function entrypoint and ``start_method="forkserver"`` starts them, gives each its
variables and its ``rank.N/`` files (``RankLogsSpecs``) as it does for a program. bench/warm_start.py: a 2-rank run's
CPU 0.64-0.71× a fresh start's, 4 ranks 0.40× (docs/running.md#how-the-ranks-start).

What a rank would have had from a fresh interpreter, it has here too:
- the variables read when torch is imported (OMP_NUM_THREADS, PYTHONUNBUFFERED, ...): the forkserver starts with
  the variables every local rank shares (``shared``), then elastic sets each rank's own;
- its own session, and death with the launcher: the forkserver ends when the launcher's end closes its pipe or the
  launcher dies (its parent-death signal, asked for before it imports torch), and a
  rank asks for SIGKILL when its parent (the forkserver) ends (launcher/worker/warm.py); the forkserver has a
  session of its own too, so a signal to the launcher's process group is the launcher's alone, which stops the
  ranks as on any signal (launcher/worker/forkserver_session.py);
- HL_RUN_DIR in its /proc environ (how the launcher finds a run's processes): the forkserver starts with it, so it
  is one of the run's processes too, and goes with them at the run's end.
Not warm: scripts (``script=``: the user's ``__main__``), CUDA plans (a fork must not inherit a CUDA context), and
``launcher.warm_start=false``. Imports torch: the backends import it only when they start a job."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import forkserver, resource_tracker

from torch.distributed.elastic.multiprocessing import LogsSpecs, PContext, start_processes

from launcher.lifeline import FORKSERVER_PARENT_ENV

PRELOAD = ["launcher.worker.forkserver_session", "launcher.worker.warm"]
"""Modules the forkserver imports once: first its own session (out of the launcher's process group, which a Ctrl-C or
``timeout`` signals whole), then everything a recipe rank imports before it reads its plan."""
TRACKER_SPARED = (signal.SIGHUP, signal.SIGQUIT)
"""Signals blocked in multiprocessing's resource tracker, a process of the launcher's group: it ignores SIGINT and
SIGTERM itself, and would die of these when the launcher's group is signalled (a closed terminal), then a new one
would print a traceback for every shared-memory name the ranks' queues give back."""
_started_with: dict[str, str] | None = None
"""The shared variables the running forkserver was started with (a sweep's next run has another run dir)."""


def shared(envs: dict[int, dict[str, str]]) -> dict[str, str]:
    """The variables with the same value in every rank's environment (HL_RUN_DIR, OMP_NUM_THREADS, ...)."""
    first, *others = envs.values()
    return {k: v for k, v in first.items() if all(env.get(k) == v for env in others)}


@contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """os.environ with ``extra`` for the moment the forkserver is started (it inherits the process's environment),
    then as it was."""
    before = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextmanager
def _blocked(signals: tuple[int, ...]) -> Iterator[None]:
    """signals blocked in this thread for the moment a process is started (it inherits the mask), then as before."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def ensure_forkserver(env: dict[str, str]) -> None:
    """A forkserver started with ``env`` and the preload, running (started now if there is none, or it ended, or it
    was started for other variables)."""
    global _started_with
    if _started_with is not None and _started_with != env:
        forkserver._forkserver._stop()  # another run's: its variables (HL_RUN_DIR) are not this run's
    with _blocked(TRACKER_SPARED):  # the tracker keeps the mask it starts with: they stay pending there, unseen
        resource_tracker.ensure_running()  # with the launcher's own variables: it is no process of the run
    forkserver.set_forkserver_preload(PRELOAD)
    with _environ({**env, FORKSERVER_PARENT_ENV: str(os.getpid())}):  # it dies with this process (forkserver_session.py)
        forkserver.ensure_running()
    _started_with = env


def rank_entry(run_dir: str) -> None:
    """The function each forked rank runs (by reference: the launcher itself never imports the worker)."""
    from launcher.worker.warm import start_rank  # the preload: already imported in the forkserver

    start_rank(run_dir)


def start_warm(name: str, run_dir: str, envs: dict[int, dict[str, str]], logs_specs: LogsSpecs) -> PContext:
    """This host's ranks (local rank -> variables), forked from the forkserver, each running
    ``launcher.worker.warm.start_rank(run_dir)``."""
    ensure_forkserver(shared(envs))
    return start_processes(name=name, entrypoint=rank_entry, args={local: (run_dir,) for local in envs}, envs=envs,
                           logs_specs=logs_specs, start_method="forkserver")
