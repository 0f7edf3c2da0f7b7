"""runtime.prepare(): host tables follow the user's LR schedule (a warm-up LambdaLR made after prepare()) and AdamW's
decoupled weight decay, against the same loop with the tables inside the engine. Every row is looked up every step,
so lazy Adam on the host is AdamW."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration

SCRIPT = '''
import torch
from torch import nn
from launcher import runtime

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(6, 4), nn.Flatten(), nn.Linear(24, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
model, optimizer = runtime.prepare(model, optimizer)
warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
ids = torch.arange(6).repeat(8, 1)            # every row, every step
target = torch.linspace(-1, 1, 8)[:, None]
for step in range(1, 9):
    loss = nn.functional.mse_loss(model(*runtime.move(ids)), runtime.move(target)[0])
    runtime.backward(loss)
    optimizer.step()
    warmup.step()
    runtime.log(step=step, loss=loss)
'''


def _losses(cwd) -> dict[int, float]:
    rows = [json.loads(line) for line in
            (cwd / "log_output" / "latest" / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _run_script(tmp_path, ranks: int, variants: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    """SCRIPT run once per variant (name -> overrides) on ``ranks`` ranks, each in its own folder: its losses."""
    (tmp_path / "train.py").write_text(SCRIPT)
    got = {}
    for name, extra in variants.items():
        cwd = tmp_path / name
        cwd.mkdir()
        res = run_cli([f"script={tmp_path / 'train.py'}", f"cluster.nproc_per_node={ranks}", *extra], cwd)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        got[name] = _losses(cwd)
    return got


def test_host_tables_follow_a_warm_up_schedule_as_the_same_table_inside_the_engine(tmp_path):
    got = _run_script(tmp_path, 1, {"inside": [], "host": ["placement.host_device_mix=1"]})
    prepared = json.loads((tmp_path / "host" / "log_output" / "latest" / "rank.0" / "prepared.json").read_text())
    assert "host" in json.dumps(prepared)  # the table did leave the engine
    worst = max(abs(got["host"][s] - got["inside"][s]) / abs(got["inside"][s]) for s in got["inside"])
    assert got["host"].keys() == got["inside"].keys() and len(got["host"]) == 8 and worst <= 1e-5, (worst, got)


def test_a_scripts_tables_split_over_the_ranks_train_as_a_copy_per_rank(tmp_path):
    """The same loop on 2 ranks: its nn.Embedding's rows split over them (placement.ps=true) or copied to each
    (placement.host_device_mix=1): the same losses, and each rank holds its block."""
    got = _run_script(tmp_path, 2, {"host": ["placement.host_device_mix=1"], "ps": ["placement.ps=true"]})
    prepared = json.loads((tmp_path / "ps" / "log_output" / "latest" / "rank.0" / "prepared.json").read_text())
    assert {k: (t["shards"], t["rows_held"]) for k, t in prepared["tables"].items()} == {"0": (2, 3)}, prepared
    worst = max(abs(got["ps"][s] - got["host"][s]) / abs(got["host"][s]) for s in got["host"])
    assert got["ps"].keys() == got["host"].keys() and len(got["ps"]) == 8 and worst <= 1e-5, (worst, got)
