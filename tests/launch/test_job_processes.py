"""How the launcher finds a run's processes on its host at the run's end (launch/supervise.py ``job_processes``): by
the run dir in their environment, and, for processes forked from its warm-start forkserver (whose environment, as
/proc shows it, is the forkserver's: no HL_RUN_DIR), by HL_FORKSERVER_PARENT=<this launcher's pid> there, even in a
session and process group of their own. Real processes, started with the environment such a process shows."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.launch.supervise import end_job_processes, job_processes
from launcher.lifeline import FORKSERVER_PARENT_ENV
from launcher.rundir import RUN_DIR_ENV

FORKS = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
         "print('forked', flush=True)\ntime.sleep(60)\n")
"""A rank's shape: it forks a child (as a DataLoader worker is, or a helper that leaves the rank's session), which
keeps the environment exec left."""


def _start(env: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", FORKS], env=env, start_new_session=True, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "forked"
    return p


def _without(*keys: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in keys}


@pytest.fixture
def started():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        for pid in [p.pid, *_children_of(p.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait(5)


def _children_of(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children()]
    return []


def test_what_this_launchers_forkserver_forked_is_the_runs_and_nothing_else(tmp_path, started):
    run = str(tmp_path)
    ours = _start({**_without(RUN_DIR_ENV), FORKSERVER_PARENT_ENV: str(os.getpid())})
    other_launchers = _start({**_without(RUN_DIR_ENV), FORKSERVER_PARENT_ENV: str(os.getpid() + 1)})
    plain = _start(_without(RUN_DIR_ENV, FORKSERVER_PARENT_ENV))  # e.g. a rank's pid another process took since
    started += [ours, other_launchers, plain]
    found = job_processes(run)
    assert sorted(found) == sorted([ours.pid, *_children_of(ours.pid)]) and len(found) == 2, found
    assert end_job_processes(run, timeout_s=5) == []
    ours.wait(5)
    assert job_processes(run) == []  # its child in a session of its own went too, not only the first process
    assert all(p.poll() is None for p in (other_launchers, plain))  # the others untouched


def test_a_process_whose_environment_names_the_run_is_the_runs(tmp_path, started):
    run = str(tmp_path)
    rank = _start({**_without(FORKSERVER_PARENT_ENV), RUN_DIR_ENV: run})
    started.append(rank)
    deadline = time.monotonic() + 5
    while len(found := job_processes(run)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rank.pid in found and len(found) == 2, found
