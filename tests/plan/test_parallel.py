"""Topology and the parts are planned up front: dp × pp × tp = world with the formula in the message, each rank's
coordinates, and the data-parallel part the run needs (chosen by what each part can do, said in the plan)."""

import re

import pytest

from launcher.errors import ConfigError
from launcher.plan import HostFacts
from launcher.plan.parallel import ParallelDims, plan_parallel
from tests.conftest import plan_of
from launcher.parallel import engine_config


def test_coords_and_groups_follow_the_mesh_order():
    d = ParallelDims(dp=2, pp=2, tp=2, world_size=8)  # mesh (pp, dp, tp): tp varies fastest
    assert [tuple(d.coords(r).values()) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert all(d.rank_of(d.coords(r)) == r for r in range(8))
    assert d.group(5, "tp") == (4, 5) and d.group(5, "dp") == (5, 7) and d.group(5, "pp") == (1, 5)


@pytest.mark.parametrize(
    "dp, pp, tp, world, message",
    [
        (2, 1, 2, 8, r"dp\(2\) \* pp\(1\) \* tp\(2\) = 4 != world_size 8 \(W\)\. Set parallel.dp=-1"),
        (-1, 1, 3, 4, r"parallel.dp=-1 cannot be inferred: world_size 4 \(W\) is not a multiple of "
                      r"parallel.pipeline_stages=1 × parallel.tp=3 = 3"),
        (0, 1, 1, 2, r"parallel.dp=0 must be a positive integer or -1"),
        (-1, 1, 0, 2, r"parallel.tp=0 must be >= 1"),
    ],
)
def test_bad_degrees_are_refused_with_the_formula(dp, pp, tp, world, message):
    dims, problems = plan_parallel(dp, pp, tp, world, "W")
    assert dims is None and len(problems) == 1
    assert re.search(message, problems[0]), problems[0]


def test_four_ranks_as_dp2_tp2(cpu_host):
    host = HostFacts(hostname="h", cpu_count=4, accelerators=0, extensions_dir="/x")
    plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=4", "parallel.tp=2", "batch.micro_size=8"], host)
    assert (plan.dims.dp, plan.dims.pp, plan.dims.tp) == (2, 1, 2)
    assert [r.coords for r in plan.ranks] == [{"pp": 0, "dp": d, "tp": t} for d in (0, 1) for t in (0, 1)]
    assert plan.batch.global_size == 8 * 2  # data parallel over dp only: tp partners see the same batch
    assert [p.name for p in plan.parts] == ["tensor_parallel", "ddp"] and plan.sharding.source == "parallel.tp"
    assert any(n.startswith("parallel.data_parallel=auto -> ddp") for n in plan.notes), plan.notes


@pytest.mark.parametrize(
    "overrides, part, why",
    [
        ([], "ddp", "replicated fp32 parameters"),
        (["zero.stage=1"], "deepspeed", "DeepSpeed ZeRO-1 for zero.stage=1; not ddp: ddp keeps whole fp32"),
        (["precision=bf16"], "deepspeed", "precision=bf16"),
        (["optimizer.target=CPU"], "deepspeed", "DeepSpeed ZeRO-2 for zero.stage=2, optimizer.target=CPU"),
        (["zero.stage=2", "parallel.pipeline_stages=2", "batch.micro_size=8"], "fsdp",
         "torch FSDP2 for zero.stage=2; not ddp: .*; not deepspeed: DeepSpeed's engine runs the backward itself"),
        (["zero.stage=3"], "fsdp", "torch FSDP2 for zero.stage=3; not ddp: .*; auto prefers it to deepspeed"),
        (["zero.stage=3", "optimizer.target=CPU"], "deepspeed", "DeepSpeed ZeRO-3 for zero.stage=3, optimizer"),
        (["precision=bf16", "parallel.tp=2", "cluster.nproc_per_node=4", "batch.micro_size=8"], "fsdp",
         "torch FSDP2 for precision=bf16"),
    ],
)
def test_auto_data_parallel_says_why(overrides, part, why, cpu_host):
    plan = plan_of(["recipe=quickstart", *overrides], cpu_host)
    assert [p.name for p in plan.parts][-2 if plan.dims.pp > 1 else -1] == part
    assert (engine_config(plan) is not None) == (part == "deepspeed")
    assert any(re.match(rf"parallel.data_parallel=auto -> {part} \(.*{why}", n) for n in plan.notes), plan.notes


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.data_parallel=ddp", "zero.stage=2"],
         r"parallel.data_parallel=ddp: ddp keeps whole fp32 parameters and their optimizer on the device: no sharding, "
         r"offload or master weights for zero.stage=2\. Set parallel.data_parallel=auto \(it picks deepspeed\)\."),
        (["parallel.data_parallel=dpp"], r"parallel.data_parallel=dpp is not one of auto, ddp, fsdp, deepspeed\. Did you "
                                         r"mean parallel.data_parallel=ddp\?"),
        (["parallel.data_parallel=deepspeed", "cluster.nproc_per_node=4", "parallel.tp=2", "batch.global_size=-1",
          "batch.micro_size=8"],
         r"parallel.data_parallel=deepspeed: DeepSpeed's engine runs the backward itself over data-parallel groups of "
         r"every rank, so it composes with neither tensor parallel nor torch.distributed.pipelining "
         r"\(parallel.tp=2\)\. Set parallel.data_parallel=auto \(it picks ddp\)\."),
        (["parallel.data_parallel=fsdp", "precision=fp16", "cluster.device=cuda"], r"cluster.device=cuda needs CUDA"),
        (["tables.deep_embedding.optimizer=lazyadam"],
         r"tables.deep_embedding.optimizer=lazyadam is not one of lazy_adam, sparse_adam, ftrl, sgd, momentum, adagrad, "
         r"rowwise_adagrad, dense\. "
         r"Did you mean tables.deep_embedding.optimizer=lazy_adam\?"),
        (["optimizer.name=adamm"], r"optimizer.name=adamm is not one of sgd, momentum, adam, adamw\. Did you mean"),
    ],
)
def test_data_parallel_and_registry_refusals(overrides, message):
    host = HostFacts(hostname="h", cpu_count=4, accelerators=0, extensions_dir="/x")
    with pytest.raises(ConfigError, match=message):
        plan_of(["recipe=wide_deep", *overrides], host)
