"""Op-level sharding and tensor parallel in real runs, each against one process at the same global batch (fp32, fixed
seed): MindSpore's sharded quick start (parallel=semi_auto: dp 2 × tp 4 per stage) with 2 pipeline stages on 16
ranks (oversubscribed on 2 cores: kept to a few steps), and gpt with tp 2 × dp 2; every rank's local shapes are the
plan's. Both are smoke runs (the recipes' smoke profiles, 6 steps): each rank's checkpoint is written and read back."""

import json
from pathlib import Path

import pytest

from tests.integration.test_engines import assert_mesh_groups_match_the_plan, losses, plan_of_run, run

pytestmark = pytest.mark.integration

SMOKE = ["smoke=true", "trainer.steps=6"]


def worst(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys() and a
    return max(abs(a[s] - b[s]) for s in a)


def check_run(run_dir: Path) -> dict:
    """Every rank computed on the planned local shapes of the operators its stage holds and read its checkpoint
    back; the plan."""
    plan = plan_of_run(run_dir)
    planned = {op["name"]: op["local_shapes"] for op in plan["sharding"]["ops"]}
    stages = plan["pipeline"]["stages"] if plan["pipeline"] else [{"layers": list(planned)}]
    for r in range(plan["world_size"]):
        rank = run_dir / f"rank.{r}"
        held = stages[plan["ranks"][r]["coords"]["pp"]]["layers"]
        assert json.loads((rank / "sharding.json").read_text()) == {n: planned[n] for n in held}, f"rank {r}"
        events = [json.loads(line).get("event") for line in (rank / "metrics.jsonl").read_text().splitlines()]
        assert "checkpoint_verified" in events, f"rank {r}"
    return plan


def test_quickstart_semi_auto_with_two_stages_on_16_ranks_matches_one_process(tmp_path):
    """The seeds' strategy spans the 8 ranks of each stage (fc1 on stage 0; relu and fc2 on stage 1, propagated);
    each stage's last operator hands on a plain tensor (to the next stage, to the loss)."""
    sixteen = run(tmp_path, "sixteen", ["recipe=quickstart", "parallel=semi_auto", "parallel.pipeline_stages=2",
                                        "cluster.nproc_per_node=16", *SMOKE])
    one = run(tmp_path, "one", ["recipe=quickstart", *SMOKE, "batch.global_size=16", "batch.micro_size=-1",
                                "cluster.nproc_per_node=1"])
    plan = check_run(sixteen)
    assert (plan["world_size"], plan["dims"]["pp"], plan["dims"]["dp"], plan["dims"]["tp"]) == (16, 2, 2, 4)
    assert [p["name"] for p in plan["parts"]] == ["tensor_parallel", "ddp", "pipeline"]
    assert [s["layers"] for s in plan["pipeline"]["stages"]] == [["fc1"], ["relu", "fc2"]]
    assert plan["sharding"]["ops"][0]["local_shapes"] == {"x": [8, 8], "w": [8, 16], "out": [8, 16]}
    d = worst(losses(one), losses(sixteen))
    print(f"quickstart semi_auto, 2 stages, 16 ranks vs 1 process: max |Δloss| {d:.3g}")
    assert d <= 1e-5
    # Column splits on 2 ranks: relu keeps fc1's split, fc2 wants its input whole (all-gather), and its split output
    # is gathered for the loss.
    cols = run(tmp_path, "cols", ["recipe=quickstart", *SMOKE, "batch.global_size=16", "batch.micro_size=-1",
                                  "cluster.nproc_per_node=2", "parallel.sharding={fc1:[[1,1],[1,2]],fc2:[[1,1],[1,2]]}"])
    plan = check_run(cols)
    assert [len(op["collectives"]) for op in plan["sharding"]["ops"]] == [0, 0, 2]
    d = worst(losses(one), losses(cols))
    print(f"quickstart column splits 2 ranks vs 1 process: max |Δloss| {d:.3g}")
    assert d <= 1e-5


def test_gpt_tp2_dp2_matches_one_process(tmp_path):
    four = run(tmp_path, "four", ["recipe=gpt", "parallel.tp=2", *SMOKE, "cluster.nproc_per_node=4"])
    one = run(tmp_path, "one", ["recipe=gpt", *SMOKE, "cluster.nproc_per_node=1"])
    plan = check_run(four)
    assert (plan["dims"]["dp"], plan["dims"]["tp"]) == (2, 2)
    assert [p["name"] for p in plan["parts"]] == ["tensor_parallel", "ddp"]
    assert_mesh_groups_match_the_plan(four)
    a = losses(one)
    assert a[6] < a[1]
    d = worst(a, losses(four))
    print(f"gpt tp 2 × dp 2 vs 1 process: max |Δloss| {d:.3g}")
    assert d <= 1e-4
