"""The row-sparse SGD twins (SparseSGD, registry names sgd and momentum) against torch.optim.SGD: plain SGD is torch's
bit for bit on a dense nn.Embedding whatever rows a batch misses; lazy momentum is torch's when every row steps every
step and differs, as documented, when one does not; their state survives a DCP checkpoint and the sparse-gradient
exchange of two ranks gives the one-process result."""

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.plan import TablePlan
from launcher.tables import ReplicatedTables
from launcher.tables.sparse_optim import SparseSGD

ROOT = Path(__file__).resolve().parents[2]


def _plan(optimizer: str, lr: float = 0.1, **kw) -> TablePlan:
    return TablePlan(name="emb", rows=12, dim=3, location="host", optimizer=optimizer, lr=lr, betas=(0.9, 0.999),
                     eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1, **kw)


def _batches(steps: int, every_row: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    if every_row:
        return [torch.cat([torch.arange(12), torch.randint(0, 12, (6,), generator=g)]) for _ in range(steps)]
    return [torch.randint(0, 6 + step, (9,), generator=g) for step in range(steps)]  # rows 6.. join late, with repeats


def _loss(rows: torch.Tensor, step: int) -> torch.Tensor:
    return (rows * torch.linspace(-1, 1, rows.shape[-1])).sin().sum() * (1 + step)


def _torch_sgd(batches, **kw) -> torch.Tensor:
    torch.manual_seed(0)
    emb = nn.Embedding(12, 3)
    opt = torch.optim.SGD(emb.parameters(), **kw)
    for step, ids in enumerate(batches):
        opt.zero_grad()
        _loss(emb(ids), step).backward()
        opt.step()
    return emb.weight.detach()


def test_sgd_twin_is_torch_sgd_bit_for_bit_on_a_dense_embedding():
    """Fed the rows looked up and torch's own gradient of them, SparseSGD gives torch's SGD bit for bit, also for rows
    no batch touched yet (neither moves them)."""
    batches = _batches(5, every_row=False)
    torch.manual_seed(0)
    emb = nn.Embedding(12, 3)
    ours = SparseSGD(emb.weight.detach().clone(), lr=0.1)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    for step, ids in enumerate(batches):
        opt.zero_grad()
        _loss(emb(ids), step).backward()
        rows = torch.unique(ids)
        ours.step(rows, emb.weight.grad[rows].clone())
        opt.step()
        assert torch.equal(ours.weight, emb.weight.detach()), step
    first = torch.unique(batches[0])
    assert first.max() < 6 and first.numel() < len(batches[0])  # step 1 missed rows 6-11 and repeated some ids


def test_sgd_twin_through_the_table_store_matches_torch_sgd():
    """The whole host path (lookup, collect, coalesce, step) with registry name sgd: within 1e-7 of torch's SGD (the
    store sums a row's repeated lookups in its own order)."""
    batches = _batches(5, every_row=False)
    torch.manual_seed(0)
    store = ReplicatedTables({"emb": nn.Embedding(12, 3).weight}, (_plan("sgd"),), torch.device("cpu"))
    for step, ids in enumerate(batches):
        _loss(store.lookup("emb", ids), step).backward()
        store.collect()
        assert store.step()
    torch.testing.assert_close(store.tables["emb"].weight, _torch_sgd(batches, lr=0.1), atol=1e-7, rtol=0)


@pytest.mark.parametrize("kw", [dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(momentum=0.5, dampening=0.1, weight_decay=0.02)])
def test_momentum_twin_is_torchs_when_every_row_steps_every_step(kw):
    batches = _batches(5, every_row=True)
    torch.manual_seed(0)
    store = ReplicatedTables({"emb": nn.Embedding(12, 3).weight}, (_plan("momentum", **kw),), torch.device("cpu"))
    for step, ids in enumerate(batches):
        _loss(store.lookup("emb", ids), step).backward()
        store.collect()
        store.step()
    torch.testing.assert_close(store.tables["emb"].weight, _torch_sgd(batches, lr=0.1, **kw), atol=1e-7, rtol=0)


def test_lazy_momentum_leaves_a_row_where_it_is_on_steps_it_is_not_looked_up():
    """torch's dense momentum keeps moving a row after its last lookup (its buffer decays every step); ours does not
    (the approximation the plan states)."""
    start = torch.randn(2, 3)
    ref = nn.Parameter(start.clone())
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9)
    ours = SparseSGD(start.clone(), lr=0.1, momentum=0.9)
    grad = torch.ones(2, 3)
    ref.grad = grad.clone()
    opt.step()
    ours.step(torch.arange(2), grad.clone())
    assert torch.equal(ours.weight, ref.detach())
    ref.grad = torch.zeros(2, 3)
    ref.grad[0] = 1.0  # row 1 is not looked up at step 2
    opt.step()
    ours.step(torch.tensor([0]), torch.ones(1, 3))
    assert torch.equal(ours.weight[0], ref.detach()[0])
    assert torch.equal(ours.weight[1], start[1] - 0.1) and not torch.equal(ref.detach()[1], start[1] - 0.1)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process, no group: as meant
@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_a_dcp_checkpoint_resumes_the_twin_where_it_was(optimizer, tmp_path):
    """Save the store's state (weights, buffer, step count) with DCP as the trainer does, load it into a fresh
    store: the next steps equal the uninterrupted run's."""
    import torch.distributed.checkpoint as dcp  # here: the two-rank test's processes import this module without it
    batches = _batches(6, every_row=False)
    kw = {"momentum": 0.9} if optimizer == "momentum" else {}

    def store():
        torch.manual_seed(0)
        return ReplicatedTables({"emb": nn.Embedding(12, 3).weight}, (_plan(optimizer, **kw),), torch.device("cpu"))

    def train(s, steps):
        for step in steps:
            _loss(s.lookup("emb", batches[step]), step).backward()
            s.collect()
            s.step()

    whole, first = store(), store()
    train(whole, range(6))
    train(first, range(3))
    dcp.save({"tables": first.state_dict()}, checkpoint_id=str(tmp_path))
    resumed = store()
    state = {"tables": resumed.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path))
    resumed.load_state_dict(state["tables"])
    assert resumed.tables["emb"].optimizer.steps == 3
    train(resumed, range(3, 6))
    assert torch.equal(resumed.tables["emb"].weight, whole.tables["emb"].weight)


def _two_rank_momentum(rank: int, port: int, out_path: str) -> None:
    """Each rank its own rows (some shared), three steps of lazy momentum through the store's exchange."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    store = ReplicatedTables({"emb": nn.Embedding(12, 3).weight}, (_plan("momentum", momentum=0.9),),
                             torch.device("cpu"), dp_group=dist.group.WORLD)
    for step in range(3):
        _loss(store.lookup("emb", torch.tensor([0, 3, 3, 5]) + 2 * rank + step), step).backward()
        store.collect()
        store.step()
    torch.save(store.tables["emb"].weight, out_path)
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_ranks_exchange_momentum_gradients_as_one_process_with_both_batches(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys; from tests.tables.test_sparse_sgd import _two_rank_momentum; "
            f"_two_rank_momentum(int(sys.argv[1]), {port}, sys.argv[2]); "
            "from launcher.fastexit import fast_exit; fast_exit(0)")  # no teardown: launcher/fastexit.py
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(tmp_path / f"w{r}.pt")], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    w0, w1 = (torch.load(tmp_path / f"w{r}.pt") for r in range(2))
    torch.manual_seed(0)
    one = ReplicatedTables({"emb": nn.Embedding(12, 3).weight}, (_plan("momentum", momentum=0.9),),
                           torch.device("cpu"))
    for step in range(3):  # the mean of the two ranks' losses: the mean of their gradients
        ids = [torch.tensor([0, 3, 3, 5]) + 2 * rank + step for rank in range(2)]
        ((_loss(one.lookup("emb", ids[0]), step) + _loss(one.lookup("emb", ids[1]), step)) / 2).backward()
        one.collect()
        one.step()
    assert torch.equal(w0, w1)  # every rank's copy stays identical
    torch.testing.assert_close(w0, one.tables["emb"].weight, atol=1e-6, rtol=0)
