"""How the launcher finds a run's processes on its host at the run's end (launch/supervise.py ``job_processes``): by
the run dir in their environment, and by the ranks' sessions, which a warm rank's forked children share while their
/proc environment is the forkserver's (no HL_RUN_DIR). Real processes: a session leader that forks a child."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from launcher.launch.supervise import end_job_processes, job_processes
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
        end_job_processes("/nonexistent", timeout_s=5, sessions={p.pid})
        p.wait(5)


def test_a_ranks_session_is_the_runs_though_its_environment_does_not_name_it(tmp_path, leaders):
    env = {k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}
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


def test_a_process_whose_environment_names_the_run_is_the_runs(tmp_path, leaders):
    run = str(tmp_path)
    rank = _start({**os.environ, RUN_DIR_ENV: run})
    leaders.append(rank)
    deadline = time.monotonic() + 5
    while len(found := job_processes(run)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rank.pid in found and len(found) == 2, found
