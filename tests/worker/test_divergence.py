"""A diverged run (a non-finite loss) is a failure, never ``ok``: the ranks stop at the step, nothing after the last
finite checkpoint is saved, and summary.json / metrics.jsonl stay strict JSON (a NaN would not parse)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_one_file_project

MODEL = '''
import torch
from torch import nn


class Diverging(nn.Module):
    """A linear model whose output turns NaN from its ``nan_at``-th training forward on."""

    def __init__(self, nan_at: int = 5):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.nan_at, self.calls = nan_at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
        y = self.fc(x)
        return y * float("nan") if self.calls >= self.nan_at else y


class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.randn(1, generator=g)
'''

RECIPE = """# @package _global_
recipe: {name: nanrun}
model: {_target_: nanmod.Diverging, nan_at: 5}
data: {_target_: nanmod.Pairs}
loss: {_target_: torch.nn.MSELoss}
batch: {global_size: 8, micro_size: 8}
trainer: {steps: 8, log_every: 1, checkpoint_every: 2}
"""


def _strict(text: str):
    def refuse(value: str):
        raise ValueError(f"not strict JSON: {value}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.integration
def test_a_nan_loss_fails_the_run_and_keeps_the_last_finite_checkpoint(tmp_path: Path):
    res, run = run_one_file_project(tmp_path, "nanmod", MODEL, "nanrun", RECIPE, "cluster.nproc_per_node=1")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    summary = _strict((run / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "training diverged: the loss is nan at step 5 on rank 0" in res.stdout.replace("\n", " ")
    rows = [_strict(line) for line in (run / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "event" not in r] == [1, 2, 3, 4]  # the NaN step is never logged
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step2", "step4"]


def test_the_deferred_watch_reports_the_first_bad_step_without_reading_each_loss():
    """On an accelerator the watch keeps the first non-finite step on the device (no per-step wait) and reports it
    when checked: the step and loss of the first bad one, not a later one, whatever came after."""
    import pytest
    import torch

    from launcher.worker.divergence import Diverged, LossWatch

    eager = LossWatch(torch.device("cpu"), rank=1, lr=0.5)
    assert not eager.deferred and LossWatch(torch.device("meta"), 0, 0.1).deferred
    eager.see(torch.tensor(0.3), 1)
    with pytest.raises(Diverged, match="the loss is inf at step 2 on rank 1"):
        eager.see(torch.tensor(float("inf")), 2)
    watch = LossWatch(torch.device("cpu"), rank=0, lr=0.5, deferred=True)
    watch.check()  # nothing seen yet
    for step, value in enumerate([0.5, 0.4, float("nan"), float("-inf"), 0.2], start=1):
        watch.see(torch.tensor(value), step)
        if step == 2:
            watch.check()  # all finite so far
    with pytest.raises(Diverged, match=r"the loss is nan at step 3 on rank 0; .*optimizer.lr \(now 0.5\)"):
        watch.check()
