"""The Trainer in one process (a real 1-rank gloo group): its state_dict carries everything the next steps depend
on, and tables follow the engine's loss scale and skipped steps."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.plan import TablePlan
from launcher.worker.mesh import build_mesh
from launcher.worker.tables import TableSet
from launcher.worker.train import build_trainer
from tests.conftest import init_one_process_group, plan_of


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    init_one_process_group()
    yield
    dist.destroy_process_group()


def _trainer(overrides, host):
    plan = plan_of(["cluster.nproc_per_node=1", *overrides], host)
    _, dp = build_mesh(plan.dims, "cpu")
    return build_trainer(plan, dp, torch.device("cpu"), 0)


CASES = {
    "gpt": ["recipe=gpt", "model.layers=1", "model.width=32", "model.heads=2", "model.seq_len=16",
            "batch.global_size=8"],
    "wide_deep_host_tables": ["recipe=wide_deep", "model.rows_per_table=500", "batch.global_size=128",
                              "placement.host_device_mix=1", "batch.grad_accum=2"],
    "quickstart": ["recipe=quickstart"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trip_continues_identically(case, cpu_host):
    a = _trainer(CASES[case], cpu_host)
    for _ in range(4):
        a.train_step()
    state = copy.deepcopy(a.state_dict())  # a snapshot: the live state goes on changing
    assert state["step"] == 4 and state["data_position"] == 4 * a.plan.batch.grad_accum
    if a.tables is not None:  # lazy Adam's bias correction needs its step count
        assert state["tables"]["deep_embedding"]["optimizer"]["steps"] == 4
    after_a = [a.train_step().item() for _ in range(3)]

    fresh = _trainer(CASES[case], cpu_host)
    without_state = [fresh.train_step().item() for _ in range(3)]
    b = _trainer(CASES[case], cpu_host)
    b.load_state_dict(state)
    after_b = [b.train_step().item() for _ in range(3)]
    assert after_b == after_a  # bit-identical: model, optimizer, tables, data position, RNG
    assert without_state != after_a  # and the state is what made them so


def _table_set(weight: torch.Tensor) -> TableSet:
    emb = nn.ModuleDict({"t": nn.Embedding(*weight.shape)})
    emb["t"].weight.data.copy_(weight)
    plan = TablePlan(name="t", rows=weight.shape[0], dim=weight.shape[1], location="host", optimizer="lazy_adam",
                     lr=0.1, betas=(0.9, 0.999), eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)
    return TableSet(emb, (plan,), torch.device("cpu"))


def test_tables_unscale_gradients_and_skip_with_the_engine():
    torch.manual_seed(0)
    weight = torch.randn(20, 4)
    rows = torch.tensor([1, 5, 5, 9])
    target = torch.randn(4, 4)
    plain, scaled = _table_set(weight), _table_set(weight)
    for tables, scale in ((plain, 1.0), (scaled, 1024.0)):
        act = tables.lookup({"t": rows}, torch.float32)["t"]
        (((act - target) ** 2).sum() * scale).backward()  # what an fp16 engine's backward does to the loss
        tables.collect_grads(loss_scale=scale)
        tables.step()
    assert torch.allclose(plain.tables["t"].weight, scaled.tables["t"].weight, rtol=0, atol=1e-6)
    assert not torch.equal(plain.tables["t"].weight, weight)

    before = scaled.tables["t"].weight.clone()
    act = scaled.lookup({"t": rows}, torch.float32)["t"]
    (act.sum() * float("inf")).backward()  # an overflow: the engine skips its step, the tables skip theirs
    scaled.collect_grads(loss_scale=1024.0)
    scaled.discard()
    scaled.step()  # nothing left to apply
    assert torch.equal(scaled.tables["t"].weight, before)
    assert scaled.tables["t"].optimizer.steps == 1
