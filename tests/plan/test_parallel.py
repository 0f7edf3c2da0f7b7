"""Topology and engine choice are planned up front: dp × pp × tp = world with the formula in the message, each rank's
coordinates, and the engine that the run needs (said in the plan)."""

import re

import pytest

from launcher.errors import ConfigError
from launcher.plan import HostFacts
from launcher.plan.parallel import ParallelDims, plan_parallel
from tests.conftest import plan_of


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
                      r"pipeline_stages\(1\) \* tp\(3\) = 3"),
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
    assert plan.engine == "tensor_parallel" and plan.sharding.source == "parallel.tp"
    assert any(n.startswith("parallel.engine=auto -> tensor_parallel") for n in plan.notes), plan.notes


@pytest.mark.parametrize(
    "overrides, engine, why",
    [
        ([], "ddp", "DeepSpeed adds nothing"),
        (["zero.stage=1"], "deepspeed", "zero.stage=1"),
        (["precision=bf16"], "deepspeed", "precision=bf16"),
        (["optimizer.target=CPU"], "deepspeed", "offload"),
    ],
)
def test_auto_engine_says_why(overrides, engine, why, cpu_host):
    plan = plan_of(["recipe=quickstart", *overrides], cpu_host)
    assert plan.engine == engine
    assert (plan.deepspeed is not None) == (engine == "deepspeed")
    assert any(n.startswith(f"parallel.engine=auto -> {engine}") and why in n for n in plan.notes), plan.notes


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.engine=ddp", "zero.stage=2"],
         r"parallel.engine=ddp runs plain data parallelism in fp32; this run asks for zero.stage=2\. "
         r"Set parallel.engine=deepspeed"),
        (["parallel.engine=dpp"], r"parallel.engine=dpp is not one of auto, ddp, deepspeed, tensor_parallel\. Did you "
                                  r"mean parallel.engine=ddp\?"),
        (["parallel.engine=deepspeed", "cluster.nproc_per_node=4", "parallel.tp=2", "batch.micro_size=8"],
         r"parallel.engine=deepspeed with parallel.tp=2: op-level sharding runs on the tensor_parallel engine"),
        (["tables.deep_embedding.optimizer=lazyadam"],
         r"tables.deep_embedding.optimizer=lazyadam is not one of lazy_adam, sparse_adam, ftrl, dense\. "
         r"Did you mean tables.deep_embedding.optimizer=lazy_adam\?"),
        (["optimizer.name=adamm"], r"optimizer.name=adamm is not one of sgd, momentum, adam, adamw\. Did you mean"),
    ],
)
def test_engine_and_registry_refusals(overrides, message):
    host = HostFacts(hostname="h", cpu_count=4, accelerators=0, extensions_dir="/x")
    with pytest.raises(ConfigError, match=message):
        plan_of(["recipe=wide_deep", *overrides], host)
