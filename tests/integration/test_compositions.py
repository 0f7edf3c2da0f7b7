"""Named compositions in real launcher runs (smoke shapes), each with its checkpoint written and read back, its loss
falling, and its per-step losses against a one-process run of the same parts:

- wide_deep with the product's three intents in one recipe: tables on the host, 2 pipeline stages (4 micro-batches)
  and the optimizer on the CPU (FSDP2's CPU offload), with its AUC from the pipeline's last stage;
- gpt on 8 ranks in 3-D: 2 pipeline stages × tensor parallel 2 × sharded data parallel 2 (ZeRO-3 on FSDP2), bf16,
  recompute of every layer, its head tied to the token embedding across the stages.

(MindSpore's sharded quick start with 2 pipeline stages: tests/integration/test_sharding_runs.py.)
"""

import json

import pytest

from tests.integration.test_engines import assert_mesh_groups_match_the_plan, losses, parts, plan_of_run, run

pytestmark = pytest.mark.integration


def verified(run_dir) -> bool:
    events = [json.loads(line).get("event") for line in (run_dir / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    return "checkpoint_verified" in events


def worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


WIDE_DEEP = ["recipe=wide_deep", "smoke=true", "trainer.steps=8", "optimizer.lr=0.01", "batch.micro_batches=4",
             "placement.host_device_mix=1", "optimizer.target=CPU"]


def test_host_tables_two_stages_and_the_optimizer_on_the_cpu(tmp_path):
    pipe = run(tmp_path, "pipe", [*WIDE_DEEP, "parallel.pipeline_stages=2"])
    one = run(tmp_path, "one", [*WIDE_DEEP, "cluster.nproc_per_node=1", "parallel.data_parallel=fsdp"])
    plan = plan_of_run(pipe)
    assert parts(pipe) == ["fsdp", "pipeline"] and parts(one) == ["fsdp"]
    fsdp = plan["parts"][0]["config"]
    assert fsdp["offload"] is not None and plan["placement"]["optimizer_location"] == "host"
    assert {t["name"]: t["location"] for t in plan["placement"]["tables"]} == {"deep_embedding": "host",
                                                                            "wide_embedding": "host"}
    d = worst(losses(pipe), losses(one))
    print(f"wide_deep host tables + 2 stages + CPU optimizer vs one process: worst relative difference {d:.1e}")
    got = losses(pipe)
    assert d <= 1e-5 and got[8] < got[1] - 0.05 and verified(pipe)
    summary = json.loads((pipe / "summary.json").read_text())
    assert summary["status"] == "ok" and 0 <= summary["eval"]["auc"] <= 1 and "bayes_auc" in summary["eval"]
    stage0 = json.loads((pipe / "rank.0" / "memory.json").read_text())  # the tables live with stage 0's module
    assert set(stage0["tables"]) <= {"deep_embedding", "wide_embedding"} and stage0["tables"]


GPT = ["recipe=gpt", "smoke=true", "trainer.steps=6", "precision=bf16", "zero.stage=3", "recompute=[all]",
       "batch.global_size=16", "batch.micro_batches=2"]


def test_gpt_in_three_dimensions_with_bf16_and_recompute(tmp_path):
    three_d = run(tmp_path, "three_d", [*GPT, "cluster.nproc_per_node=8", "parallel.pipeline_stages=2",
                                        "parallel.tp=2"])
    one = run(tmp_path, "one", [*GPT, "cluster.nproc_per_node=1", "parallel.data_parallel=fsdp"])
    plan = plan_of_run(three_d)
    assert parts(three_d) == ["tensor_parallel", "recompute", "fsdp", "pipeline"]
    assert (plan["dims"]["pp"], plan["dims"]["dp"], plan["dims"]["tp"], plan["dims"]["dp_shard"]) == (2, 2, 2, 2)
    assert plan["pipeline"]["tied"] and plan["parts"][2]["config"]["mixed_precision"]["param_dtype"] == "bfloat16"
    assert_mesh_groups_match_the_plan(three_d)
    d = worst(losses(three_d), losses(one))
    print(f"gpt pp 2 × tp 2 × fsdp 2, bf16, recompute vs one process (bf16, fsdp): worst relative difference {d:.1e}")
    assert d <= 5e-3 and verified(three_d)  # bf16: within a rounding step (bench/composability.py BF16_TOLERANCE)
    assert {json.dumps(losses(three_d, r)) for r in range(8)} == {json.dumps(losses(three_d))}  # every rank logs it
