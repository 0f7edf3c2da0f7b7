"""A tabular run with a validation split and early stopping (issue 45), on 2 ranks: it stops before its epoch limit
on data it overfits (a 3,000-row file, 40 epochs), keeps the best checkpoint beside the last, and scores the test
split once, at the end, on the best weights — the same test scores as one process trained to the best step. Killed
after its best checkpoint and restarted, it validates and stops exactly as the uninterrupted run did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.data.make_ctr_csv import write_ctr_csv

pytestmark = pytest.mark.integration

COMMON = ["recipe=wide_deep", "data=tabular", "data.path=ctr.csv", "data.label=clicked", "data.positive=yes",
          "data.val_fraction=0.1", "batch.global_size=256", "trainer.log_every=4"]
EARLY = [*COMMON, "trainer.epochs=40", "trainer.early_stop.patience=2", "cluster.nproc_per_node=2"]


def _records(rank_dir: Path, event: str) -> dict[int, dict]:
    records = [json.loads(line) for line in (rank_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in records if m.get("event") == event}


def _run(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    res = run_cli(list(args), tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = (tmp_path / "log_output" / "latest").resolve()
    return run, json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("early")
    write_ctr_csv(str(tmp / "ctr.csv"), 3000)
    whole = _run(tmp, *EARLY)
    killed = _run(tmp, *EARLY, "debug.fail_rank=1", f"debug.fail_step={whole[1]['early_stop']['best_step'] + 2}",
                  "launcher.max_restarts=1")
    best_step = whole[1]["early_stop"]["best_step"]
    one = _run(tmp, *COMMON, "trainer.epochs=0", f"trainer.steps={best_step}", "cluster.nproc_per_node=1")
    return whole, killed, one


def test_it_stops_early_keeps_the_best_checkpoint_and_scores_the_test_split_on_it(runs):
    (run, s), _, (_, one) = runs
    e = s["early_stop"]
    assert s["status"] == "ok" and e["stopped"] and e["stopped_at"] == s["completed_steps"] < s["steps"], s
    assert e["metric"] == "loss" and e["mode"] == "min" and e["best_step"] < e["stopped_at"]
    vals = _records(run / "rank.0", "val")
    assert e["best"] == min(v["loss"] for v in vals.values()) == vals[e["best_step"]]["loss"]
    losses = [vals[k]["loss"] for k in sorted(vals) if k > e["best_step"]]
    assert len(losses) == 2  # patience 2: two validations without improvement, then every rank stopped
    ckpts = run / "checkpoints"
    assert (ckpts / "best").resolve() == (ckpts / f"step{e['best_step']}").resolve()
    assert sorted(p.name for p in ckpts.glob("step*")) == sorted({f"step{e['best_step']}", f"step{e['stopped_at']}"})
    for rank in (0, 1):  # the test split is scored once, at the end
        assert list(_records(run / f"rank.{rank}", "eval")) == [e["stopped_at"]]
    # ... on the best weights: one process trained to the best step scores the test split the same
    for k in ("loss", "auc", "accuracy"):
        assert abs(s["eval"][k] - one["eval"][k]) <= 1e-5, (k, s["eval"], one["eval"])
    assert abs(one["eval"]["loss"] - s["eval"]["loss"]) <= 1e-5 and s["eval"]["n"] == one["eval"]["n"] == 600


def test_killed_after_its_best_checkpoint_it_resumes_and_stops_at_the_same_step(runs):
    (run, s), (again, s2), _ = runs
    assert [a["status"] for a in s2["attempts"]] == ["failed", "ok"], "the injected failure did not happen"
    assert s2["attempts"][1]["resumed_from"].endswith(f"step{s['early_stop']['best_step']}")
    assert s2["early_stop"] == s["early_stop"]
    first, second = _records(run / "rank.0", "val"), _records(again / "rank.0", "val")
    resumed_at = s["early_stop"]["best_step"]
    assert [k for k in second] == [k for k in first if k > resumed_at]  # validated from the best checkpoint on
    for k, v in second.items():
        assert abs(v["loss"] - first[k]["loss"]) <= 1e-6, (k, v, first[k])
    assert abs(s2["eval"]["loss"] - s["eval"]["loss"]) <= 1e-6
