"""memory.json's "peak" (what the plan's memory estimate is checked against) and torch's MemTracker split: in a real
2-rank run, and the tracker in this process on a small model."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from launcher.worker.accounting import (TRACKER_CATEGORIES, StepTracker, measure_peak, peak_resident_bytes,
                                        resident_bytes)
from tests.conftest import run_cli

STEPS = 5


@pytest.mark.integration
def test_every_rank_records_its_peak_at_the_end_of_the_run(tmp_path, monkeypatch):
    """wide_deep on torch DDP with its tables, a checkpoint at the end and an evaluation: memory.json is rewritten
    after both (step = the last step) with rss >= rss_after_build >= rss_at_start > 0, keeps the first step's keys,
    and with HL_MEMORY_TRACKER=1 holds MemTracker's split of the first step."""
    monkeypatch.setenv("HL_MEMORY_TRACKER", "1")
    res = run_cli(["recipe=wide_deep", f"trainer.steps={STEPS}", "model.rows_per_table=2000",
                   "batch.global_size=256", "eval.batches=1"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = (tmp_path / "log_output" / "latest").resolve()
    checkpoint = run_dir / "checkpoints" / f"step{STEPS}" / "checkpoint.json"
    cuda = json.loads((run_dir / "plan.json").read_text())["device_type"] == "cuda"
    for rank in (0, 1):
        path = run_dir / f"rank.{rank}" / "memory.json"
        memory = json.loads(path.read_text())
        assert {"host", "device", "devices", "offload", "tables", "activations"} <= memory.keys()
        peak = memory["peak"]
        assert peak["rss"] >= peak["rss_after_build"] >= peak["rss_at_start"] > 0, peak
        assert peak["step"] == STEPS
        if cuda:
            assert peak["device_max_reserved"] >= peak["device_max_allocated"] > 0
        else:
            assert peak["device_max_reserved"] is None and peak["device_max_allocated"] is None
        assert path.stat().st_mtime >= checkpoint.stat().st_mtime  # written after the final save
        assert not path.with_name("memory.json.part").exists()
        tracker = memory["tracker"]
        assert tracker["step"] == 1
        for split in tracker["peak"].values():  # per torch device
            assert set(split) == set(TRACKER_CATEGORIES.values())
            assert split["total"] == sum(v for k, v in split.items() if k != "total") > 0
        # the tables, outside the engine, are the tracker's "other": their weights and optimizer states
        tables = sum(memory[where][kind] for where in ("host", "device") for kind in ("tables", "table_states"))
        assert sum(split["other"] for split in tracker["peak"].values()) == tables


def test_peak_of_this_process():
    """VmHWM is never below the RSS now; measure_peak says null for the device on a CPU."""
    assert peak_resident_bytes() >= resident_bytes() > 0
    peak = measure_peak({"rss_at_start": 1, "rss_after_build": 2}, torch.device("cpu"), 7)
    assert peak == {"rss": peak["rss"], "rss_at_start": 1, "rss_after_build": 2, "device_max_reserved": None,
                    "device_max_allocated": None, "step": 7}
    assert measure_peak({}, torch.device("cpu"), 0)["rss_at_start"] is None


def _train(model: nn.Module, opt: torch.optim.Optimizer, batches: list[torch.Tensor], tracker=None) -> torch.Tensor:
    """One optimizer step over micro-batches (as Trainer.train_step: next_micro_batch before each forward)."""
    total = torch.zeros(())
    for x in batches:
        if tracker is not None:
            tracker.next_micro_batch()
        loss = model(x).pow(2).mean() / len(batches)
        loss.backward()
        total += loss.detach()
    opt.step()
    opt.zero_grad()
    return total


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_step_tracker_splits_the_peak_and_changes_nothing(micro_batches):
    """Bit-identical parameters with and without the tracker, over accumulated micro-batches too (MemTracker alone
    refuses a second forward of the root module); every category named; the parameters counted whole."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    twin = copy.deepcopy(model)
    batches = [torch.randn(32, 64) for _ in range(micro_batches)]
    opt, twin_opt = (torch.optim.Adam(m.parameters(), lr=0.1) for m in (model, twin))
    _train(twin, twin_opt, batches)
    with StepTracker(SimpleNamespace(module=model, optimizer=opt), None) as tracker:
        _train(model, opt, batches, tracker)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    split = tracker.split["cpu"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert set(split) == set(TRACKER_CATEGORIES.values())
    assert split["parameters"] == params and split["total"] >= params
    assert split["total"] == sum(v for k, v in split.items() if k != "total")
    _train(model, opt, batches)  # after the tracked step: a plain step again (the tracker's hooks are gone)
