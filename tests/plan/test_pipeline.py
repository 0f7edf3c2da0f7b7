"""Pipeline stages are planned from intent before launch: MindSpore-style stages per layer, or a partition by
parameters or layer count, one or several stages per rank; every stage shows its layers, parameters and memory, and
the bubble (P-1)/(V·M+P-1). A pipeline composes with ZeRO (fsdp), offload, bf16, tensor parallel and host tables;
what is refused is refused with the key, the value and a fix."""

import json
import re

import pytest

from launcher.errors import ConfigError
from launcher.plan import HostFacts, LaunchPlan
from launcher.plan.pipeline import plan_pipeline
from launcher.report.plan_view import pipeline_tree
from tests.conftest import plan_of

FOUR = HostFacts(hostname="h", cpu_count=4, accelerators=0, extensions_dir="/x")
LAYERS = ("embedding", "block.0", "block.1", "head")
PARAMS = {"embedding": 100, "block.0": 50, "block.1": 50, "head": 90}


def test_partition_by_parameters_and_uniform_and_the_bubble():
    plan, problems = plan_pipeline(2, 4, {}, "parameters", LAYERS, PARAMS, ())
    assert not problems and [s.layers for s in plan.stages] == [("embedding", "block.0"), ("block.1", "head")]
    assert plan.bubble == pytest.approx(1 / 5) and [s.in_flight for s in plan.stages] == [2, 1]
    lopsided = {**PARAMS, "head": 1000}  # the largest stage as small as it can be: head alone
    plan, _ = plan_pipeline(2, 8, {}, "parameters", LAYERS, lopsided, ())
    assert plan.stages[1].layers == ("head",) and plan.bubble == pytest.approx(1 / 9)
    plan, _ = plan_pipeline(3, 1, {}, "uniform", (*LAYERS, "x"), {**PARAMS, "x": 1}, ())
    assert [len(s.layers) for s in plan.stages] == [1, 2, 2] and plan.bubble == pytest.approx(2 / 3)


def test_a_weight_shared_across_stages_is_held_by_each_and_once_within_one():
    tie = ((("embedding.token.weight", "head.proj.weight"), 80),)
    plan, _ = plan_pipeline(2, 4, {}, "parameters", LAYERS, PARAMS, tie)
    assert plan.tied[0].stages == (0, 1) and [s.params for s in plan.stages] == [150, 140]
    stages = {"embedding": 0, "block.0": 0, "block.1": 0, "head": 0}
    plan, problems = plan_pipeline(2, 4, {**stages, "head": 1}, "parameters", LAYERS, PARAMS, tie)
    assert plan.tied and not problems
    plan, problems = plan_pipeline(2, 4, {**stages, "embedding": 0}, "parameters", LAYERS, PARAMS, tie)
    assert "no layer on stage 1" in problems[0]


@pytest.mark.parametrize(
    "stages, message",
    [
        ({"embedding": 0, "block.0": 0, "blok.1": 1, "head": 1},
         r"parallel.stages: the model has no layer blok.1\. Did you mean block.1\?"),
        ({"embedding": 0, "block.0": 1, "block.1": 0, "head": 1},
         r"layer block.1 is on stage 0 after block.0 on stage 1; stages must follow the forward order"),
        ({"embedding": 0, "block.0": 0, "block.1": 2, "head": 1},
         r"parallel.stages.block.1=2 must be a stage number from 0 to 1"),
        ({"embedding": 0, "block.0": 0}, r"parallel.stages puts no layer on stage 1 of the 2 stages\. Name the layer "
                                         r"each stage begins at"),
    ],
)
def test_bad_stages(stages, message):
    plan, problems = plan_pipeline(2, 4, stages, "parameters", LAYERS, PARAMS, ())
    assert plan is None and any(re.search(message, p) for p in problems), problems


def test_a_named_layer_begins_its_stage():
    """parallel.stages may name only where each stage begins (a split point): the layers before the first named one
    are on stage 0, each later one on the stage of the last named layer before it."""
    plan, problems = plan_pipeline(2, 4, {"block.1": 1}, "parameters", LAYERS, PARAMS, ())
    assert not problems
    assert [s.layers for s in plan.stages] == [LAYERS[:LAYERS.index("block.1")], LAYERS[LAYERS.index("block.1"):]]


def test_a_layer_no_stage_may_begin_at_is_never_cut_before():
    """A graph split cannot send a value that is no tensor (a KeyedJaggedTensor): the partition cuts elsewhere, as
    evenly as the other cuts allow, and too few cuts left is refused with where it can cut."""
    barred = (("block.1", "input kjt (a KeyedJaggedTensor) would cross into it from the stage before, to layer "
                          "block.1"),)
    plan, _ = plan_pipeline(2, 4, {}, "parameters", LAYERS, PARAMS, ())
    assert plan.stages[1].layers[0] == "block.1"  # the best cut, barred below
    plan, _ = plan_pipeline(2, 4, {}, "parameters", LAYERS, PARAMS, (), uncuttable=barred)
    assert [s.layers for s in plan.stages] == [("embedding",), ("block.0", "block.1", "head")]  # 190 beats 200
    plan, problems = plan_pipeline(4, 4, {}, "parameters", LAYERS, PARAMS, (), uncuttable=barred)
    assert plan is None and problems == [
        "parallel.pipeline_stages=4 needs 3 places to cut the model into stages; it can begin a stage only at block.0, "
        "head (pipeline stages send each other tensors only: not at block.1: input kjt (a KeyedJaggedTensor) would "
        "cross into it from the stage before, to layer block.1). Lower parallel.pipeline_stages."]


def test_resnet_default_is_the_seeds_two_stages_and_round_trips(cpu_host):
    plan = plan_of(["recipe=resnet"], cpu_host)
    p = plan.pipeline
    assert p.partition == "parallel.stages" and p.micro_batches == 4
    assert [s.layers for s in p.stages] == [("head", "layer1", "layer2"), ("layer3", "layer4", "fc")]
    assert sum(s.params for s in p.stages) == plan.memory.dense_params  # no weight is shared
    assert all(s.activation_bytes and s.state_bytes for s in p.stages)
    assert plan.memory.device.total == max(s.state_bytes for s in p.stages)
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    text = str(pipeline_tree(plan).label)
    assert "1f1b; bubble (P-1)/(V·M+P-1) = 1/5 = 20.0%" in text and "losses from stage 1" in text


def test_a_batch_that_does_not_divide_by_micro_batches_names_that_key(cpu_host):
    """Its fix had said "change batch.grad_accum", and giving both was refused next."""
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=resnet", "batch.micro_batches=3"], cpu_host)
    assert e.value.problems == ["batch does not divide: global 32 != micro ? × accum 3 × dp 1; 32 is not a multiple "
                                "of 3. Set batch.global_size=30, or change batch.micro_batches."]
    with pytest.raises(ConfigError) as e:  # its grad_accum=-1 would infer nothing: micro_batches sets it
        plan_of(["recipe=resnet", "batch.micro_batches=4", "batch.micro_size=5"], cpu_host)
    assert e.value.problems == ["batch does not divide: global 32 != micro 5 × accum 4 × dp 1 (= 20). Set "
                                "batch.global_size=20, or set batch.micro_size to -1 to infer it."]


def test_gpt_tie_and_micro_batches(cpu_host):
    plan = plan_of(["recipe=gpt", "parallel.pipeline_stages=2", "batch.micro_batches=4"], cpu_host)
    assert plan.batch.grad_accum == 4 and plan.dims.dp == 1 and [p.name for p in plan.parts] == ["ddp", "pipeline"]
    assert plan.pipeline.tied[0].paths == ("embedding.token.weight", "head.proj.weight")
    assert any("batch.micro_batches=4 sets batch.grad_accum (was 1)" in n for n in plan.notes)
    plan = plan_of(["recipe=resnet", "parallel.pipeline_stages=1"], cpu_host)  # the recipe's stages are unused
    assert plan.pipeline is None and [p.name for p in plan.parts] == ["recompute", "ddp"]
    assert any("parallel.stages is not used" in n for n in plan.notes)


@pytest.mark.parametrize(
    "overrides, parts",
    [
        (["recipe=gpt", "zero.stage=2"], ["fsdp", "pipeline"]),
        (["recipe=gpt", "zero.stage=1"], ["fsdp", "pipeline"]),  # the tied head's copies sum their gradient shards
        (["recipe=gpt", "optimizer.target=CPU"], ["fsdp", "pipeline"]),
        (["recipe=gpt", "precision=bf16"], ["fsdp", "pipeline"]),
        (["recipe=gpt", "parallel.tp=2", "cluster.nproc_per_node=4"], ["tensor_parallel", "ddp", "pipeline"]),
        (["recipe=wide_deep", "placement.host_device_mix=1"], ["ddp", "pipeline"]),
        (["recipe=wide_deep", "eval.metrics=binary"], ["ddp", "pipeline"]),
        (["recipe=gpt", "recompute=[all]", "parallel.schedule=gpipe"], ["recompute", "ddp", "pipeline"]),
    ],
)
def test_a_pipeline_composes_with_the_other_intents(overrides, parts):
    plan = plan_of([*overrides, "parallel.pipeline_stages=2"], FOUR)
    assert [p.name for p in plan.parts] == parts and plan.dims.pp == 2


def test_interleaved_1f1b_loops_the_stages_over_the_ranks(cpu_host):
    plan = plan_of(["recipe=gpt", "model.layers=6", "parallel.pipeline_stages=2", "parallel.stages_per_rank=2",
                    "parallel.schedule=interleaved_1f1b", "batch.micro_batches=4"], cpu_host)
    p = plan.pipeline
    assert len(p.stages) == 4 and [p.rank_of(s.index) for s in p.stages] == [0, 1, 0, 1]
    assert p.bubble == pytest.approx(1 / 9)  # (P-1)/(V·M+P-1): the slots are cut V ways
    assert plan.parts[-1].config["schedule"] == "interleaved_1f1b"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["recipe=gpt", "parallel.data_parallel=deepspeed", "zero.stage=1"],
         r"parallel.data_parallel=deepspeed: DeepSpeed's engine runs the backward itself .* \(parallel.pipeline_stages=2\)"),
        (["recipe=gpt", "parallel.schedule=interleaved_1f1b"],
         r"parallel.schedule=interleaved_1f1b runs several stages per pipeline rank; parallel.stages_per_rank=1\. "
         r"Set parallel.stages_per_rank=2"),
        (["recipe=gpt", "parallel.stages_per_rank=2"],
         r"parallel.stages_per_rank=2 with parallel.schedule=1f1b: only interleaved_1f1b runs several stages per rank"),
        (["recipe=gpt", "parallel.schedule=1F1B"], r"parallel.schedule=1F1B is not one of 1f1b, gpipe, interleaved_1f1b"),
        (["recipe=gpt", "parallel.schedule=interleaved_1f1b", "parallel.stages_per_rank=2", "model.layers=6",
          "batch.micro_batches=5"], r"batch.micro_batches=5 with parallel.schedule=interleaved_1f1b on 2 pipeline "
                                    r"ranks: .* needs 5 to be a multiple of 2 rounds\. Set batch.micro_batches=4"),
        (["recipe=gpt", "parallel.partition=params"], r"parallel.partition=params is not one of parameters, "
                                                      r"uniform\. Did you mean parallel.partition=parameters\?"),
        (["recipe=quickstart", "parallel.pipeline_stages=4", "cluster.nproc_per_node=4"],
         r"parallel.pipeline_stages=4 needs at least 4 layers; the model has 3 \(fc1, relu, fc2\)"),
        (["recipe=resnet", "parallel.stages.layr3=1"], r"parallel.stages.layr3: no such key \(value 1\)\. Did you "
                                                       r"mean parallel.stages.layer3\?"),
        (["recipe=resnet", "+parallel.stages.layr3=1"], r"the model has no layer layr3\. Did you mean layer3\?"),
    ],
)
def test_pipeline_refusals(overrides, message):
    overrides = [*overrides, "parallel.pipeline_stages=2"] if "parallel.pipeline_stages=4" not in overrides \
        else overrides
    with pytest.raises(ConfigError, match=message):
        plan_of(overrides, FOUR)
