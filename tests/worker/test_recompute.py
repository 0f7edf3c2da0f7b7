"""Recompute (activation checkpointing) in one process on a real 1-rank group: the same losses as without, fewer
bytes kept for the backward; unknown layer names refused before launch."""

import pytest
import torch
import torch.distributed as dist

from launcher.errors import ConfigError
from launcher.worker.mesh import build_mesh
from launcher.worker.train import build_trainer
from tests.conftest import init_one_process_group, plan_of

GPT = ["recipe=gpt", "cluster.nproc_per_node=1", "model.layers=2", "model.width=32", "model.heads=2",
       "model.seq_len=32", "model.dropout=0.1", "batch.global_size=8"]  # dropout: recompute must replay its RNG


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    init_one_process_group()
    yield
    dist.destroy_process_group()


def _train(overrides, host, steps=3):
    plan = plan_of([*GPT, *overrides], host)
    mesh, dp = build_mesh(plan.dims, "cpu")
    trainer = build_trainer(plan, dp, torch.device("cpu"), 0, mesh)
    losses = [trainer.train_step().item() for _ in range(steps)]
    if plan.recompute:
        print(f"{' '.join(overrides)}: estimated {plan.activations['kept_bytes_with_recompute']:,} B, measured "
              f"{trainer.saved_activation_bytes:,} B")
        if [p.name for p in plan.parts] == ["recompute", "ddp"]:  # the plan's meta-device estimate against the bytes
            measured = trainer.saved_activation_bytes  # really kept
            assert abs(plan.activations["kept_bytes_with_recompute"] - measured) <= 0.05 * measured, measured
    return losses, trainer.saved_activation_bytes


@pytest.mark.parametrize("engine", [[], ["zero.stage=3", "parallel.data_parallel=deepspeed"]],
                         ids=["ddp", "deepspeed_zero3"])
def test_recompute_gives_the_same_losses_and_keeps_fewer_bytes(cpu_host, engine):
    plain, plain_bytes = _train(engine, cpu_host)
    blocks, blocks_bytes = _train([*engine, "recompute=[block.0,block.1]"], cpu_host)
    every, every_bytes = _train([*engine, "recompute=[all]"], cpu_host)
    for losses in (blocks, every):
        assert max(abs(a - b) for a, b in zip(plain, losses)) <= 1e-6, (plain, losses)
    assert every_bytes < blocks_bytes < plain_bytes
    if not engine:  # DDP: the meta-device estimate of what no recompute keeps (ZeRO-3's hooks keep ~7 % more)
        estimate = plan_of([*GPT, "recompute=[all]"], cpu_host).activations["kept_bytes"]
        assert abs(estimate - plain_bytes) <= 0.05 * plain_bytes, (estimate, plain_bytes)
    print(f"saved activations per micro-batch: none {plain_bytes:,} B, blocks {blocks_bytes:,} B "
          f"({plain_bytes / blocks_bytes:.1f}x less), all {every_bytes:,} B ({plain_bytes / every_bytes:.1f}x less)")


def test_an_unknown_layer_is_refused_with_the_layers_there_are(cpu_host):
    with pytest.raises(ConfigError, match=r"recompute: the model has no layer blok.1. Did you mean block.1\? "
                                          r"Its layers: embedding, block.0, block.1, head"):
        plan_of([*GPT, "recompute=[blok.1]"], cpu_host)
    assert plan_of([*GPT, "recompute=[all]"], cpu_host).recompute == ("embedding", "block.0", "block.1", "head")
