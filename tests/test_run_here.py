"""run_cli's launch in the test's own process (tests/conftest.py ``_run_here``): a run of a built-in recipe leaves this
process as it found it, so that the next test in the same pytest worker sees what a fresh one would; and which
arguments it leaves to a process of their own (``launches_here``)."""

from __future__ import annotations

import logging
import os
import signal
import sys

import psutil
import pytest

from launcher.backends.warm_start import forkserver_pid
from tests.conftest import launches_here, processes_of_run, run_cli

pytestmark = pytest.mark.integration


def _state() -> dict:
    loggers = [logging.root, *(x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger))]
    return {
        "environ": dict(os.environ), "cwd": os.getcwd(), "sys.path": list(sys.path), "sys.argv": list(sys.argv),
        "signals": {s: signal.getsignal(s) for s in signal.valid_signals()},
        "loggers": {x.name: (x.level, list(x.handlers), x.propagate, x.disabled) for x in loggers},
        "children": sorted(p.pid for p in psutil.Process().children(recursive=True)
                           if p.status() != "zombie" and p.pid != forkserver_pid()),
    }


def test_a_launched_run_leaves_this_process_as_it_found_it(tmp_path):
    before = _state()
    assert launches_here(["recipe=mnist_mlp"], tmp_path)
    res = run_cli(["recipe=mnist_mlp", "trainer.steps=2", "data.samples=128", "data.eval_samples=32"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "summary:" in res.stdout  # the launcher's console, captured
    ranks = sorted(p.name for p in (tmp_path / "log_output" / "latest").resolve().glob("rank.*"))
    assert ranks == ["rank.0", "rank.1"]  # real ranks ran
    server = forkserver_pid()  # the warm start's: kept for the next run, as in a sweep
    assert server is not None and psutil.Process(server).ppid() == os.getpid()
    again = run_cli(["recipe=mnist_mlp", "trainer.steps=2", "data.samples=128", "data.eval_samples=32",
                     "output.run_name=again"], tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert forkserver_pid() == server  # the second run's ranks forked from the same one
    assert not processes_of_run(tmp_path / "log_output" / "again"), processes_of_run(tmp_path / "log_output" / "again")
    cold = run_cli(["recipe=mnist_mlp", "trainer.steps=2", "data.samples=128", "data.eval_samples=32",
                    "output.run_name=cold", "launcher.warm_start=false"], tmp_path)
    assert cold.returncode == 0, cold.stdout[-3000:] + cold.stderr[-3000:]
    assert forkserver_pid() is None and not psutil.pid_exists(server)  # a cold run keeps no idle forkserver
    after = _state()
    for key in before:
        if key == "loggers":  # loggers made during the run (torch's, on first use) may be new; the old ones as were
            assert {k: v for k, v in after[key].items() if k in before[key]} == before[key]
        else:
            assert after[key] == before[key], key


@pytest.mark.parametrize("args, here", [
    (["recipe=wide_deep", "trainer.steps=2"], True),
    (["script=train.py"], False),
    (["++script=train.py"], False),
    (["--config-dir", "conf", "recipe=mine"], False),
    (["recipe=wide_deep", "model._target_=my.Model"], False),
    (["-m", "recipe=gpt,wide_deep"], False),
    (["recipe=wide_deep", "--info"], False),
    (["recipe=wide_deep", "cluster.launch=mpi"], False),
])
def test_what_runs_here_and_what_gets_a_process(tmp_path, args, here):
    assert launches_here(args, tmp_path) is here


def test_a_folder_with_the_users_code_gets_a_process(tmp_path):
    (tmp_path / "model.py").write_text("")
    assert not launches_here(["recipe=wide_deep"], tmp_path)
    (tmp_path / "model.py").unlink()
    (tmp_path / "conf").mkdir()
    assert not launches_here(["recipe=wide_deep"], tmp_path)
