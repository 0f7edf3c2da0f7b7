"""placement.prefetch on real ranks: wide_deep with host tables on 2 gloo ranks, rows gathered 2 micro-batches ahead
with 2 micro-batches a step, logs the per-step losses of the serial path and ends with its tables, bit for bit, on
tables so small (520 rows, 32 samples x 26 fields a micro-batch per rank) that consecutive micro-batches share most
rows: no row was served stale. The prefetched run fails after step 15 and resumes from its step-10 checkpoint (the
micro-batches it had drawn ahead are drawn again): steps 11-20 as the serial run's too. Runs shared by the
assertions."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration

COMMON = ["recipe=wide_deep", "placement.host_device_mix=1", "model.rows_per_table=20", "batch.global_size=128",
          "batch.grad_accum=2", "trainer.steps=20", "trainer.log_every=1", "trainer.checkpoint_every=10",
          "eval.batches=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    serial = tmp_path_factory.mktemp("serial")
    res = run_cli([*COMMON, "placement.prefetch=0"], serial)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out["serial"] = (serial / "log_output" / "latest").resolve()
    cwd = tmp_path_factory.mktemp("prefetch")
    failed = run_cli([*COMMON, "placement.prefetch=2", "debug.fail_rank=1", "debug.fail_step=15"], cwd)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    out["failed"] = (cwd / "log_output" / "latest").resolve()
    resumed = run_cli([*COMMON, "placement.prefetch=2", "trainer.resume=latest"], cwd)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    out["resumed"] = (cwd / "log_output" / "latest").resolve()
    return out


def _records(run: Path, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in (run / f"rank.{rank}" / "metrics.jsonl").read_text().splitlines()]


def _losses(run: Path) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["local_loss"]) for r in _records(run) if "event" not in r}


def test_prefetched_and_resumed_runs_log_the_serial_losses_and_tables_bit_for_bit(runs):
    serial = _losses(runs["serial"])
    assert sorted(serial) == list(range(1, 21))
    assert _losses(runs["failed"]) == {s: serial[s] for s in range(1, 16)}
    assert _losses(runs["resumed"]) == {s: serial[s] for s in range(11, 21)}
    evals = {k: [r["loss"] for r in _records(runs[k]) if r.get("event") == "eval"] for k in ("serial", "resumed")}
    assert evals["resumed"] == evals["serial"]
    digests = {k: [json.loads((runs[k] / f"rank.{r}" / "tables.json").read_text()) for r in (0, 1)]
               for k in ("serial", "resumed")}
    assert digests["resumed"] == digests["serial"] and digests["serial"][0] == digests["serial"][1]


def test_every_lookup_was_prefetched_and_the_plan_says_so(runs):
    for rank in (0, 1):
        stats, = [r for r in _records(runs["resumed"], rank) if r.get("event") == "prefetch"]
        assert stats["served"] == 2 * 10 * 2 and stats["missed"] == 0  # 2 tables, 10 steps x 2 micro-batches
        assert stats["urgent_rows"] > 0 and stats["deferred_rows"] > 0
    assert not [r for r in _records(runs["serial"]) if r.get("event") == "prefetch"]
    plans = {k: json.loads((run / "plan.json").read_text())["placement"] for k, run in runs.items()}
    assert (plans["serial"]["prefetch"], plans["resumed"]["prefetch"]) == (0, 2)
    assert "2 micro-batches ahead" in plans["resumed"]["prefetch_words"]
