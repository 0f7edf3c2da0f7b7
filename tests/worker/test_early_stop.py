"""trainer.early_stop's bookkeeping (launcher/worker/early_stop.py) and the validation rows of a tabular file."""

from __future__ import annotations

import math

import torch

from launcher.plan.types import EarlyStopPlan
from launcher.recipes.wide_deep._tabular_val import carve, val_rows
from launcher.worker.early_stop import EarlyStop


def _seen(plan: EarlyStopPlan, values: list[float]) -> tuple[list[bool], EarlyStop]:
    early = EarlyStop(plan)
    improved = []
    for step, v in enumerate(values, start=1):
        if early.stopped:
            break
        improved.append(early.see({"loss": v, "auc": v}, step))
    return improved, early


def test_it_stops_after_patience_validations_without_improvement():
    improved, early = _seen(EarlyStopPlan("loss", "min", 2, 0.0), [0.9, 0.7, 0.72, 0.69, 0.70, 0.71, 0.5])
    assert improved == [True, True, False, True, False, False]  # 0.5 is never seen: it stopped at step 6
    assert (early.best, early.best_step, early.bad, early.stopped) == (0.69, 4, 2, True)


def test_min_delta_and_mode_max():
    improved, early = _seen(EarlyStopPlan("auc", "max", 3, 0.01), [0.60, 0.605, 0.62, 0.625, 0.626, 0.9])
    assert improved == [True, False, True, False, False, True]  # +0.005 is no improvement with min_delta 0.01
    assert (early.best, early.best_step, early.stopped) == (0.9, 6, False)


def test_a_nan_never_improves_and_the_state_round_trips():
    improved, early = _seen(EarlyStopPlan("loss", "min", 2, 0.0), [math.nan, 0.5, math.nan, math.nan])
    assert improved == [False, True, False, False] and early.stopped and early.best_step == 2
    again = EarlyStop(early.plan)
    again.load_state_dict(early.state_dict())
    assert again.state_dict() == early.state_dict() == {"best": 0.5, "best_step": 2, "bad": 2, "stopped": True}


def test_validation_rows_come_from_the_train_split_and_none_leaves_it_as_it_was():
    train = (torch.arange(80.0).reshape(40, 2), torch.arange(40), torch.ones(40))
    same, none = carve(train, 10, 0.0)
    assert none is None and all(a is b for a, b in zip(same, train))
    rest, val = carve(train, 10, 0.1)  # 10 % of the 50 rows of the file
    assert val_rows(40, 10, 0.1) == 5 and len(val[2]) == 5 and len(rest[2]) == 35
    assert torch.equal(torch.cat([val[1], rest[1]]), train[1])  # every train row once: validation, or still train
