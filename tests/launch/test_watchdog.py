"""The watchdog on real processes and heartbeat files: its limit follows the slowest step, and the stalled rank is
named by evidence (process state, silence, step) with every rank's stacks."""

import json
import signal
import subprocess
import sys
import time

import pytest

from launcher.launch.watchdog import Watchdog
from launcher.rundir import RunDir

RANK = ("import faulthandler, signal, sys, time; "
        "faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True); time.sleep(60)")


@pytest.fixture
def ranks(tmp_path):
    """Two rank processes that answer the stack request (as every rank of a run does), with their rank dirs."""
    run = RunDir(tmp_path)
    procs = {}
    for r in (0, 1):
        run.rank(r).path.mkdir()
        with open(run.rank(r).stderr, "w") as err:
            procs[r] = subprocess.Popen([sys.executable, "-c", RANK], stderr=err)
    time.sleep(0.5)  # faulthandler registered
    yield run, procs
    for p in procs.values():
        p.kill()
        p.wait()


def _beat(run, rank, step):
    run.rank(rank).heartbeat.write_text(json.dumps({"step": step, "time": time.time(), "rss": 1, "host_available": 1}))


def test_the_rank_behind_is_named_and_both_stacks_are_collected(ranks):
    run, procs = ranks
    dog = Watchdog({r: run.rank(r) for r in procs}, lambda: {r: p.pid for r, p in procs.items()}, watchdog_s=0.3,
                   period_s=0.0)
    _beat(run, 0, 10)
    _beat(run, 1, 7)
    assert dog.check({0, 1}) is None  # just seen: not stalled
    time.sleep(0.4)
    stall = dog.check({0, 1})
    assert stall is not None and stall.ranks == (1,) and "behind" in stall.why
    assert stall.steps == {0: 10, 1: 7}
    assert all("most recent call first" in stall.stacks[r] for r in (0, 1))


def test_a_stopped_rank_is_named_by_its_state_and_the_limit_follows_slow_steps(ranks):
    run, procs = ranks
    dog = Watchdog({r: run.rank(r) for r in procs}, lambda: {r: p.pid for r, p in procs.items()}, watchdog_s=0.2,
                   period_s=0.0)
    for step in (1, 2):
        _beat(run, 0, step)
        _beat(run, 1, step)
        dog.check({0, 1})
        time.sleep(0.1)
    assert dog.limit_s >= 10 * 0.1  # 10 of the slowest step (0.1 s) is above watchdog_s
    procs[1].send_signal(signal.SIGSTOP)
    time.sleep(0.3)
    assert dog.check({0, 1}) is None  # 0.3 s idle: under the step-relative limit
    time.sleep(dog.limit_s)
    stall = dog.check({0, 1})
    procs[1].send_signal(signal.SIGCONT)
    assert stall.ranks == (1,) and stall.states[1].startswith("stopped") and "process state" in stall.why
    assert stall.stacks[1] == "" and stall.stacks[0]  # the stopped rank could not answer
