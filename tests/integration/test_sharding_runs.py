"""Op-level sharding and tensor parallel in real runs, each against one process at the same global batch (fp32, fixed
seed): the quick start with the seeds' strategy on 8 ranks (dp 2 × tp 4, oversubscribed on 2 cores: kept to a few
steps) and gpt with tp 2 × dp 2; every rank's local shapes are the plan's."""

import json
from pathlib import Path

import pytest

from tests.integration.test_engines import QUIET, losses, plan_of_run, run

pytestmark = pytest.mark.integration

GPT = ["recipe=gpt", "model.layers=1", "model.width=32", "model.heads=2", "model.seq_len=16", "batch.global_size=8",
       "trainer.steps=6", *QUIET]


def worst(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys() and a
    return max(abs(a[s] - b[s]) for s in a)


def assert_local_shapes_are_planned(run_dir: Path) -> None:
    plan = plan_of_run(run_dir)
    planned = {op["name"]: op["local_shapes"] for op in plan["sharding"]["ops"]}
    for r in range(plan["world_size"]):
        assert json.loads((run_dir / f"rank.{r}" / "sharding.json").read_text()) == planned, f"rank {r}"


def test_quickstart_semi_auto_on_8_ranks_matches_one_process(tmp_path):
    eight = run(tmp_path, "eight", ["recipe=quickstart", "parallel=semi_auto", "trainer.steps=6", *QUIET])
    one = run(tmp_path, "one", ["recipe=quickstart", "batch.global_size=16", "batch.micro_size=-1",
                                "cluster.nproc_per_node=1", "trainer.steps=6", *QUIET])
    plan = plan_of_run(eight)
    assert (plan["world_size"], plan["dims"]["dp"], plan["dims"]["tp"]) == (8, 2, 4)
    assert plan["sharding"]["ops"][0]["local_shapes"] == {"x": [8, 8], "w": [8, 16], "out": [8, 16]}
    assert_local_shapes_are_planned(eight)
    a = losses(one)  # (batches of 16 from 64 fixed random samples: too noisy over 6 steps to call falling)
    d = worst(a, losses(eight))
    print(f"quickstart semi_auto 8 ranks vs 1 process: max |Δloss| {d:.3g}")
    assert d <= 1e-5


def test_gpt_tp2_dp2_matches_one_process(tmp_path):
    four = run(tmp_path, "four", [*GPT, "cluster.nproc_per_node=4", "parallel.tp=2"])
    one = run(tmp_path, "one", [*GPT, "cluster.nproc_per_node=1"])
    plan = plan_of_run(four)
    assert (plan["dims"]["dp"], plan["dims"]["tp"], plan["engine"]) == (2, 2, "tensor_parallel")
    assert_local_shapes_are_planned(four)
    a = losses(one)
    assert a[6] < a[1]
    d = worst(a, losses(four))
    print(f"gpt tp 2 × dp 2 vs 1 process: max |Δloss| {d:.3g}")
    assert d <= 1e-4
