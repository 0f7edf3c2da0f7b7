"""runtime.log checks its arguments in the rank, naming the one that is wrong: a step that is no int >= 0 or a value
that is no number used to reach metrics.jsonl and crash the launcher that reads it."""

import json

import numpy as np
import pytest
import torch

from launcher import runtime
from launcher.rundir import RUN_DIR_ENV


@pytest.fixture(autouse=True)
def _no_run_dir(monkeypatch):
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)  # outside a run: rank 0 prints the record


@pytest.mark.parametrize("kwargs, error, match", [
    ({"step": "epoch-1"}, TypeError, r"runtime.log\(step='epoch-1'\): step must be an int >= 0 .*not str"),
    ({"step": 1.0}, TypeError, r"step must be an int >= 0 .*not float"),
    ({"step": None}, TypeError, r"runtime.log\(step=None\): step must be an int"),
    ({"step": True}, TypeError, r"not bool"),
    ({"step": -1}, ValueError, r"runtime.log\(step=-1\): step must be an int >= 0"),
    ({"step": 1, "loss": "0.5"}, TypeError, r"runtime.log\(loss='0.5'\): loss must be a number"),
    ({"step": 1, "loss": torch.ones(3)}, ValueError, r"loss=<tensor of shape \(3,\), torch.float32>\): loss must be "),
    ({"step": 1, "acc": [0.5]}, TypeError, r"runtime.log\(acc=\[0.5\]\): acc must be a number .*not list"),
    ({"step": 1, "acc": 1j}, TypeError, r"acc must be a number"),
    ({"step": 1, "time": 3.0}, ValueError, r"runtime.log\(time=...\): time is a name the launcher writes"),
])
def test_a_bad_argument_is_refused_in_the_rank_by_name(kwargs, error, match, capsys):
    with pytest.raises(error, match=match):
        runtime.log(**kwargs)
    assert capsys.readouterr().out == ""  # nothing was recorded


def test_numbers_of_any_kind_are_recorded_as_plain_numbers(capsys):
    runtime.log(step=np.int64(2), loss=torch.tensor([0.5]), acc=np.float32(0.25), n=3, ok=True)
    runtime.log(step=torch.tensor(3), loss=1)
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first == {"step": 2, "local_loss": 0.5, "loss": 0.5, "acc": 0.25, "n": 3, "ok": True}
    assert second == {"step": 3, "local_loss": 1.0, "loss": 1.0} and type(first["step"]) is int
