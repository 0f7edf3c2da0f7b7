"""A rank started warm: forked from Python's forkserver, which imported torch, torch._dynamo and the worker once for
the launcher's runs (launcher/backends/warm_start.py), instead of a fresh ``python -m launcher.worker`` importing them
again.

Importing this module is the forkserver's preload: what every recipe rank imports before it reads its plan (on this
2-core machine ~4 s of CPU a rank: torch 1.8 s, and torch._dynamo 1.6-1.9 s, which every torch optimizer imports when
it is built). Nothing of the user's is imported here: their modules are imported by each rank, after its variables
are set, as in a fresh interpreter.

``start_rank`` is torch elastic's function entrypoint (``start_processes(..., start_method="forkserver")``): it runs
in the forked child after elastic set the rank's variables and redirected its output to ``rank.N/``, and does what a
fresh rank's start would have: its own session (the launcher stops a rank's process group), the parent-death signal
(the forkserver, which ends when the launcher does), ``sys.argv``, the stack-dump signal; then the same ``run_rank``
and the same ends as ``python -m launcher.worker`` (launcher/worker/__main__.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback
from contextlib import suppress
from multiprocessing import forkserver

import torch
import torch._dynamo  # noqa: F401  (imported by every torch optimizer's constructor: the largest part of the preload)
import torch.distributed  # noqa: F401
from torch.distributed.elastic.multiprocessing.errors import record

from launcher import lifeline
from launcher.fastexit import fast_exit
from launcher.rundir import register_stack_dump
from launcher.worker.train import run_rank

__all__ = ["start_rank"]

PR_SET_NAME = 15
"""prctl option: the calling thread's name (the process's, for its main thread)."""
FORKSERVER = os.getpid()
"""The forkserver's pid (this module is its preload): a rank's parent. A rank that finds another parent when it asks
for the parent-death signal was orphaned as it started (the forkserver died with its launcher) and ends at once."""


def start_rank(run_dir: str) -> None:
    """One rank, in a process forked from the forkserver; never returns. Its folder and ``sys.path`` are the
    launcher's as the rank started (multiprocessing's preparation data), not the forkserver's (the first run's)."""
    # multiprocessing hands each forked child the write end of the forkserver's "alive" pipe, which keeps the
    # forkserver up while any child lives; a rank lets go of it, so that the launcher's end (its own end of the pipe
    # closed) ends the forkserver, and that the rank by its parent-death signal.
    alive = forkserver._forkserver._forkserver_alive_fd
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None
    lifeline.die_with_parent(FORKSERVER, signal.SIGKILL)
    # multiprocessing made this process's default start method the forkserver's (its spawn preparation sets it):
    # back to the platform's, which a fresh interpreter has (a DataLoader's workers are forked from the rank).
    multiprocessing.set_start_method(None, force=True)
    os.setsid()  # its own session and process group, as torch elastic starts a program's ranks
    _name(f"hl-rank-{os.environ.get('RANK', '')}")
    sys.argv = [os.path.join(os.path.dirname(__file__), "__main__.py"), run_dir]
    register_stack_dump()
    code = 1
    try:
        record(run_rank)(run_dir)  # as launcher.worker's @record main: the error goes to rank.N/error.json
        code = 0
    except SystemExit as e:  # as the interpreter ends on sys.exit: a message is printed, None is 0
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            _print(str(e.code))
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # printed as the interpreter would; the exit skips the teardown (launcher/worker/__main__.py)
        _print(traceback.format_exc().rstrip("\n"))
    finally:
        fast_exit(code)  # nothing leaves this function: multiprocessing would print it on the launcher's terminal


def _print(text: str) -> None:
    """To the rank's stderr, unless it cannot be written (a full disk: rank.N/error.json may hold it)."""
    with suppress(OSError, ValueError):
        print(text, file=sys.stderr)


def _name(name: str) -> None:
    """The process's name as ``ps -o comm`` and ``top`` show it (15 bytes at most): a forked rank's command line is
    the forkserver's (``python -c from multiprocessing.forkserver import main ...``)."""
    with suppress(OSError, AttributeError):  # no prctl here
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
