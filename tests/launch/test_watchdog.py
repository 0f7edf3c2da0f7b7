"""The watchdog on real processes and heartbeat files: its limit follows the slowest step, and the stalled rank is
named by evidence (process state, silence, step) with every rank's stacks."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.launch import watchdog
from launcher.launch.watchdog import Watchdog
from launcher.metrics_writer import MetricsWriter
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


def _beat(run, rank, step, **extra):
    run.rank(rank).heartbeat.write_text(json.dumps({"step": step, "time": time.time(), "rss": 1, "host_available": 1,
                                                    **extra}))


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


def _poll(dog, running, seconds):
    """Every watchdog finding over ``seconds`` (polled every 0.05 s)."""
    found, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        found.append(dog.check(running))
        time.sleep(0.05)
    return [s for s in found if s is not None]


def test_a_rank_saving_longer_than_the_limit_is_not_hung_and_one_stuck_outside_a_save_is(tmp_path):
    """Rank 0 writes a checkpoint for over 2 limits (its MetricsWriter's saving thread keeps the heartbeat moving);
    rank 1 steps on, then stops outside a save: only rank 1 is named, rank 0 is reported as saving."""
    run = RunDir(tmp_path)
    saver = MetricsWriter(run.rank(0))
    saver.step_done(4)
    run.rank(1).path.mkdir()
    _beat(run, 1, 4)
    dog = Watchdog({0: run.rank(0), 1: run.rank(1)}, dict, watchdog_s=1.0, period_s=0.0)
    with saver.saving():
        assert run.rank(0).read_heartbeat()["state"] == "saving"
        began, step = time.monotonic(), 5
        # 2 s at 0.1 s a step: twice the limit; on a loaded host the steps measure slower and the limit (at least 10
        # of the slowest step) rises, so rank 1 steps on until the save has run for twice the limit as it stands
        while step < 25 or time.monotonic() - began < 2 * dog.limit_s:
            _beat(run, 1, step)
            step += 1
            assert _poll(dog, {0, 1}, 0.1) == []
        stalls = _poll(dog, {0, 1}, dog.limit_s + 2.0)  # rank 1 stopped; rank 0 saves on (a loaded host polls late)
    assert run.rank(0).read_heartbeat().get("state") is None  # the save is over
    stall = stalls[0]
    assert stall.ranks == (1,) and stall.limit_s <= stall.idle_s < stall.limit_s + 0.5
    assert list(stall.saving) == [0] and stall.saving[0] > 2 * stall.limit_s  # saving for over 2 limits: not named
    assert stall.to_dict()["saving_s"]["0"] > 2.0
    saver.close()


def test_a_save_that_runs_past_its_limits_is_hung_though_its_heartbeat_moves(tmp_path, monkeypatch):
    """A collective inside a save may hang while the saving thread beats on: after SAVE_LIMITS limits it is a hang."""
    monkeypatch.setattr(watchdog, "SAVE_LIMITS", 2)
    run = RunDir(tmp_path)
    saver = MetricsWriter(run.rank(0))
    saver.step_done(4)
    dog = Watchdog({0: run.rank(0)}, dict, watchdog_s=1.0, period_s=0.0)
    with saver.saving():
        assert _poll(dog, {0}, 1.6) == []  # past watchdog_s, within 2 limits
        stalls = _poll(dog, {0}, 0.6)
    saver.close()
    assert stalls and stalls[0].ranks == (0,) and stalls[0].limit_s == 2.0 and stalls[0].idle_s >= 2.0
    assert stalls[0].saving[0] >= 2.0


def test_saves_at_different_steps_are_timed_apart(tmp_path, monkeypatch):
    """Checkpoints every step with fast steps: the launcher may see only "saving" beats, but each save is at its own
    step, so their times are not added up into one long save."""
    monkeypatch.setattr(watchdog, "SAVE_LIMITS", 2)
    run = RunDir(tmp_path)
    run.rank(0).path.mkdir()
    dog = Watchdog({0: run.rank(0)}, dict, watchdog_s=0.5, period_s=0.0)
    for step in (100, 200, 300):  # 0.6 s each: over watchdog_s, under 2 limits; 1.8 s of saves in all
        for _ in range(6):
            _beat(run, 0, step, state="saving")
            assert dog.check({0}) is None
            time.sleep(0.1)


def test_a_rank_that_never_finishes_its_first_step_is_hung_after_the_first_steps_allowance(ranks, monkeypatch):
    """Rank 1 never beats (stuck in step 1), rank 0 neither (it waits for rank 1): the watchdog, made as the job
    starts, names them after FIRST_STEP_LIMITS limits, not after one limit (a first step is legitimately slower);
    a script's ranks (first_step=False), which may never beat, are not bounded before their first heartbeat."""
    monkeypatch.setattr(watchdog, "FIRST_STEP_LIMITS", 4)
    run, procs = ranks
    pids = lambda: {r: p.pid for r, p in procs.items()}  # noqa: E731
    dog = Watchdog({r: run.rank(r) for r in procs}, pids, watchdog_s=0.25, period_s=0.0)
    script = Watchdog({r: run.rank(r) for r in procs}, pids, watchdog_s=0.25, period_s=0.0, first_step=False)
    assert _poll(dog, {0, 1}, 0.6) == []  # past one limit, within the first step's allowance
    os.kill(procs[1].pid, signal.SIGSTOP)
    try:
        stalls = _poll(dog, {0, 1}, 1.0)
    finally:
        os.kill(procs[1].pid, signal.SIGCONT)
    assert stalls and stalls[0].first_step and stalls[0].ranks == (1,) and "process state" in stalls[0].why
    assert stalls[0].limit_s == 1.0 and stalls[0].idle_s >= 1.0 and stalls[0].steps == {0: 0, 1: 0}
    assert stalls[0].to_dict()["before_first_step"] is True
    assert script.check({0, 1}) is None


ELASTIC_ENTRY = "from torch.distributed.elastic.multiprocessing.errors import record\n"
"""A rank's entry, as torch elastic starts it: record() wraps it, so every rank's stack holds a torch.distributed
frame at its bottom."""
SLEEPS_IN_FORWARD = ("import faulthandler, pathlib, signal, sys, time\n" + ELASTIC_ENTRY +
                     "faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)\n"
                     "def forward():\n    pathlib.Path(sys.argv[1]).touch()\n    time.sleep(60)\n"
                     "record(forward)()\n")
WAITS_IN_BACKWARD = ("import faulthandler, pathlib, signal, sys, time, torch\n" + ELASTIC_ENTRY +
                     "faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)\n"
                     "class Reduce(torch.autograd.Function):  # where DDP's bucket all-reduce waits: in the backward\n"
                     "    @staticmethod\n    def forward(ctx, x):\n        return x * 1\n"
                     "    @staticmethod\n    def backward(ctx, g):\n        pathlib.Path(sys.argv[1]).touch()\n        time.sleep(60)\n"
                     "def step():\n    Reduce.apply(torch.ones(1, requires_grad=True)).sum().backward()\n"
                     "record(step)()\n")


def test_a_rank_outside_a_collective_is_named_when_its_peer_waits_in_the_backward(tmp_path):
    """One rank sleeps in its forward, its peer waits in the backward (where torch DDP's gradient all-reduce waits
    for it, below any Python frame of torch.distributed): the one in the forward is named by its stack, not both
    by elimination."""
    run = RunDir(tmp_path)
    procs = {}
    for r, code in enumerate((SLEEPS_IN_FORWARD, WAITS_IN_BACKWARD)):
        run.rank(r).path.mkdir()
        with open(run.rank(r).stderr, "w") as err:
            procs[r] = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"in.{r}")], stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"in.{r}").exists() for r in procs):  # in the forward, in the backward
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs.values())
            time.sleep(0.1)
        dog = Watchdog({r: run.rank(r) for r in procs}, lambda: {r: p.pid for r, p in procs.items()},
                       watchdog_s=0.2, period_s=0.0)
        for r in procs:
            _beat(run, r, 5)
        assert dog.check({0, 1}) is None
        time.sleep(0.3)
        stall = dog.check({0, 1})
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert all("torch/distributed/elastic" in stall.stacks[r] for r in procs), stall.stacks
    assert stall.ranks == (0,) and stall.why.startswith("its stack: outside torch.distributed and backward"), stall
