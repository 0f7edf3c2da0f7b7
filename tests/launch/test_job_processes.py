"""How the launcher finds a run's processes on its host at the run's end (launch/supervise.py ``job_processes``): by
the run dir in their environment, and by the ranks' sessions, which a warm rank's forked children share while their
/proc environment is the forkserver's (no HL_RUN_DIR, but HL_FORKSERVER_PARENT: this launcher's pid). Real processes:
a session leader that forks a child, started with the environment a forked rank shows."""

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

FORKS = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('forked', flush=True)\ntime.sleep(60)\n"
"""A rank's shape: it forks a child (as a DataLoader worker), which shares its session and its environment as exec
left it."""


def _start(env: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", FORKS], env=env, start_new_session=True, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "forked"
    return p


@pytest.fixture
def leaders():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # the leader and its forked child
        p.wait(5)


def test_a_ranks_session_is_the_runs_though_its_environment_does_not_name_it(tmp_path, leaders):
    env = {**{k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}, FORKSERVER_PARENT_ENV: str(os.getpid())}
    rank, other = _start(env), _start(env)
    leaders += [rank, other]
    run = str(tmp_path)
    assert job_processes(run) == []  # neither names the run dir
    found = job_processes(run, sessions={rank.pid})
    assert rank.pid in found and len(found) == 2, found  # the rank and its forked child, not the other session
    assert not set(job_processes(run, sessions={rank.pid})) & set(job_processes(run, sessions={other.pid}))
    assert end_job_processes(run, timeout_s=5, sessions={rank.pid}) == []
    rank.wait(5)
    assert job_processes(run, sessions={rank.pid}) == []  # the child went too (SIGKILL), not only the leader
    assert len(job_processes(run, sessions={other.pid})) == 2  # the other session untouched


def test_a_session_not_forked_from_this_launchers_forkserver_is_not_the_runs(tmp_path, leaders):
    """A rank's pid an unrelated process took after the rank ended (or another launcher's forked rank)."""
    plain = _start({k: v for k, v in os.environ.items() if k not in (RUN_DIR_ENV, FORKSERVER_PARENT_ENV)})
    other = _start({**os.environ, FORKSERVER_PARENT_ENV: str(os.getpid() + 1)})
    leaders += [plain, other]
    assert job_processes(str(tmp_path), sessions={plain.pid, other.pid}) == []


def test_a_process_whose_environment_names_the_run_is_the_runs(tmp_path, leaders):
    run = str(tmp_path)
    rank = _start({**os.environ, RUN_DIR_ENV: run})
    leaders.append(rank)
    deadline = time.monotonic() + 5
    while len(found := job_processes(run)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rank.pid in found and len(found) == 2, found
