"""Pipeline parallelism in real runs: DeepSpeed's PipelineModule over 2 stages, and 2 stages × dp 2, computes the
same per-step losses as one process with the same micro-batches as gradient accumulation (GPT with its head tied to
the token embedding, so the shared weight's gradient sum across stages is exercised); resnet's default run (the
seeds' two stages, recompute on layer1-4, BatchNorm, momentum SGD) on ZeRO-1 gives the one-process losses too, and
its checkpoint reads back."""

import json

import pytest

from tests.integration.test_engines import losses, plan_of_run, run

pytestmark = pytest.mark.integration

GPT = ["recipe=gpt", "model.layers=2", "model.width=32", "model.heads=2", "model.seq_len=16", "trainer.steps=6",
       "batch.global_size=16", "batch.micro_batches=4", "trainer.log_every=1", "trainer.checkpoint_every=-1",
       "eval.batches=1"]


def test_two_stages_and_two_by_dp2_match_one_process(tmp_path):
    one = run(tmp_path, "one", [*GPT, "cluster.nproc_per_node=1"])
    pipe = run(tmp_path, "pipe", [*GPT, "cluster.nproc_per_node=2", "parallel.pipeline_stages=2"])
    pipe_dp = run(tmp_path, "pipe_dp", [*GPT, "cluster.nproc_per_node=4", "parallel.pipeline_stages=2"])
    plan = plan_of_run(pipe_dp)
    assert plan["engine"] == "pipeline" and plan["dims"]["pp"] == 2 and plan["dims"]["dp"] == 2
    stages = [s["layers"] for s in plan["pipeline"]["stages"]]
    assert stages == [["embedding", "block.0"], ["block.1", "head"]]  # balanced by parameters
    assert plan["pipeline"]["tied"][0]["paths"] == ["embedding.token.weight", "head.proj.weight"]
    reference = losses(one)
    for run_dir in (pipe, pipe_dp):
        got = losses(run_dir)
        worst = max(abs(got[s] - reference[s]) for s in reference)
        print(f"{run_dir.name}: max |loss - one process| over {len(reference)} steps = {worst:.2e}")
        assert got.keys() == reference.keys() and worst <= 1e-5, (got, reference)
    # every rank of the pipeline reports the last stage's loss
    assert losses(pipe_dp, rank=0) == losses(pipe_dp, rank=3)


RESNET = ["recipe=resnet", "model.width=4", "model.blocks=[1,1,1,1]", "data.image_size=16", "batch.global_size=16",
          "trainer.steps=4", "trainer.log_every=1", "eval.batches=1", "trainer.checkpoint_every=0"]


def test_resnet_seeds_stages_with_recompute_and_zero1_match_one_process(tmp_path):
    """The seeds' stages with recompute of layer1-4 (resnet's default), BatchNorm and momentum SGD, on ZeRO-1: the
    one-process losses. Its gradients' norm is above 1, so a gradient clipping DeepSpeed would add by default (it
    clips at 1.0 unless told otherwise) changes the steps; the checkpoint is written and read back (smoke)."""
    one = run(tmp_path, "one", [*RESNET, "cluster.nproc_per_node=1", "parallel.pipeline_stages=1"])
    pipe = run(tmp_path, "pipe", [*RESNET, "cluster.nproc_per_node=2", "zero.stage=1", "smoke=true",
                                  "trainer.steps=4"])
    plan = plan_of_run(pipe)
    assert plan["engine"] == "pipeline" and plan["recompute"] == ["layer1", "layer2", "layer3", "layer4"]
    assert plan["deepspeed"]["zero_optimization"]["stage"] == 1 and plan["deepspeed"]["gradient_clipping"] == 0.0
    assert [s["layers"] for s in plan["pipeline"]["stages"]] == [["head", "layer1", "layer2"],
                                                                ["layer3", "layer4", "fc"]]
    worst = max(abs(a - b) for a, b in zip(losses(one).values(), losses(pipe).values()))
    print(f"resnet 2 stages, ZeRO-1, recompute: max |loss - one process| over 4 steps = {worst:.2e}")
    assert losses(one).keys() == losses(pipe).keys() and worst <= 1e-5
    events = [json.loads(line) for line in (pipe / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "checkpoint_verified" for e in events)
    memory = json.loads((pipe / "rank.1" / "memory.json").read_text())
    assert memory["activations"]["saved_bytes_per_micro_batch"] > 0
