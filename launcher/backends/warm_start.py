"""Recipe ranks on CPU started warm: torch elastic's function entrypoint through Python's forkserver.

A fresh ``python -m launcher.worker`` spends most of a short run importing: on a 2-core machine ~4 s of CPU a rank
(torch, then torch._dynamo, which every torch optimizer imports when it is built), against ~1 s of training in a
smoke run. Here the imports happen once per launcher: ``multiprocessing``'s forkserver (a fresh interpreter, started by
this launcher) imports ``launcher.worker.warm`` and forks every rank from that state; torch elastic's
``start_processes`` with a function entrypoint and ``start_method="forkserver"`` starts them, gives each its
variables and its ``rank.N/`` files (``RankLogsSpecs``) as it does for a program. bench/warm_start.py: a 2-rank run's
CPU 0.64-0.71× a fresh start's, 4 ranks 0.40× (docs/running.md#how-the-ranks-start).

What a rank would have had from a fresh interpreter, it has here too:
- the variables read when torch is imported (OMP_NUM_THREADS, PYTHONUNBUFFERED, ...): the forkserver starts with
  the variables every local rank shares (``shared``) but the run's own, then elastic sets each rank's;
- its own session, and death with the launcher: the forkserver ends when the launcher's end closes its pipe or the
  launcher dies (its parent-death signal, asked for before it imports torch), and a
  rank asks for SIGKILL when its parent (the forkserver) ends (launcher/worker/warm.py); the forkserver has a
  session of its own too, so a signal to the launcher's process group is the launcher's alone, which stops the
  ranks as on any signal (launcher/worker/forkserver_session.py);
- one forkserver for the launcher's life, not one a run: it starts without the run's own variables (``PER_RUN``:
  the run dir, the rendezvous address, the world's shape, which elastic gives each rank) and serves every later run
  whose other variables are the same (a sweep's jobs, an elastic restart); a rank's folder and ``sys.path`` are the
  launcher's as it starts (multiprocessing's preparation data). A forked rank's /proc environ is the forkserver's
  (without HL_RUN_DIR, with the launcher's pid in FORKSERVER_PARENT_ENV): at a run's end the launcher takes every
  process forked from its forkserver but the forkserver for the run's (``supervise.job_processes``).
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
from launcher.rundir import RUN_DIR_ENV

PRELOAD = ["launcher.worker.forkserver_session", "launcher.worker.warm"]
"""Modules the forkserver imports once: first its own session (out of the launcher's process group, which a Ctrl-C or
``timeout`` signals whole), then everything a recipe rank imports before it reads its plan."""
TRACKER_SPARED = (signal.SIGHUP, signal.SIGQUIT)
"""Signals blocked in multiprocessing's resource tracker, a process of the launcher's group: it ignores SIGINT and
SIGTERM itself, and would die of these when the launcher's group is signalled (a closed terminal), then a new one
would print a traceback for every shared-memory name the ranks' queues give back."""
PER_RUN = frozenset({RUN_DIR_ENV, "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK",
                     "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_WORLD_SIZE",
                     "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                     "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"})
"""A run's own variables, which nothing reads while torch and the worker are imported: the forkserver starts without
them (each rank gets its run's from elastic), so that the next run, with another run dir and port, forks from the
same one. Any other variable that differs (OMP_NUM_THREADS, a user's TORCH_*) starts a new forkserver."""
_started_with: dict[str, str] | None = None
"""The variables the running forkserver was started with."""


def shared(envs: dict[int, dict[str, str]]) -> dict[str, str]:
    """The variables with the same value in every rank's environment (HL_RUN_DIR, OMP_NUM_THREADS, ...)."""
    first, *others = envs.values()
    return {k: v for k, v in first.items() if all(env.get(k) == v for env in others)}


def forkserver_env(shared_env: dict[str, str]) -> dict[str, str]:
    """The forkserver's variables for ranks whose shared ones are ``shared_env``: this process's, then theirs, without
    the run's own (PER_RUN)."""
    return {k: v for k, v in {**os.environ, **shared_env}.items() if k not in PER_RUN}


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """os.environ exactly ``env`` for the moment the forkserver is started (it inherits the process's environment),
    then as it was; only the variables that differ are changed (other threads read the environment meanwhile)."""
    before = dict(os.environ)
    for key in before.keys() - env.keys():
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key in os.environ.keys() - before.keys():
            del os.environ[key]
        os.environ.update(before)


@contextmanager
def _blocked(signals: tuple[int, ...]) -> Iterator[None]:
    """signals blocked in this thread for the moment a process is started (it inherits the mask), then as before."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def ensure_forkserver(shared_env: dict[str, str]) -> None:
    """A forkserver started with the preload and ``forkserver_env(shared_env)``, running: the one already running
    when it was started with the same variables, else a new one (the old one, another run's, stopped)."""
    global _started_with
    env = forkserver_env(shared_env)
    if _started_with != env:
        stop_forkserver()  # another run's (none started: nothing to stop)
    with _blocked(TRACKER_SPARED):  # the tracker keeps the mask it starts with: they stay pending there, unseen
        resource_tracker.ensure_running()  # with the launcher's own variables: it is no process of the run
    forkserver.set_forkserver_preload(PRELOAD)
    with _environ({**env, FORKSERVER_PARENT_ENV: str(os.getpid())}):  # it dies with this process (forkserver_session.py)
        forkserver.ensure_running()
    _started_with = env


def stop_forkserver() -> None:
    """Stop this process's forkserver, if it started one: a run that starts its ranks cold (a script, a CUDA plan,
    launcher.warm_start=false) after warm ones does not keep it idle beside them (~26 MiB, which the memory plan
    counts for warm runs only)."""
    global _started_with
    if _started_with is not None:
        forkserver._forkserver._stop()
        _started_with = None


def forkserver_pid() -> int | None:
    """The pid of this process's running forkserver, if one was started."""
    return forkserver._forkserver._forkserver_pid


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
