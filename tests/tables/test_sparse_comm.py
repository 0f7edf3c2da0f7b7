"""The tables' sparse-gradient exchange over real gloo processes: the mean, identical on every rank, in the same
collectives on every rank every step, also when one rank's batch missed a table (it used to issue a different
sequence of collectives there, and hang or pair the wrong data)."""

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from launcher.plan import TablePlan
from launcher.tables import ReplicatedTables
from launcher.tables.sparse_comm import coalesce, reduce_tables


def test_coalesce_sums_duplicates_in_row_order():
    rows, values = coalesce(torch.tensor([5, 1, 5, 3, 1]), torch.arange(10.0).reshape(5, 2))
    assert rows.tolist() == [1, 3, 5]
    assert values.tolist() == [[10.0, 12.0], [6.0, 7.0], [4.0, 6.0]]


ROOT = Path(__file__).resolve().parents[2]


def _spawn(fn, tmp_path: Path, world: int = 2) -> dict:
    """Run ``fn(rank, port, world, out)`` in ``world`` subprocesses (plain ones: multiprocessing's spawn would leave
    its resource tracker running beside pytest); {rank: what it put in out[rank]}."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys, torch; from tests.tables.test_sparse_comm import {fn}; out = {{}}; "
            "{fn}(int(sys.argv[1]), {port}, {world}, out); torch.save(out, sys.argv[2]); "
            "from launcher.fastexit import fast_exit; fast_exit(0)").format(  # no teardown: launcher/fastexit.py
        fn=fn.__name__, port=port, world=world)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(tmp_path / f"out{r}.pt")], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for r in range(world)]
    assert [p.wait(timeout=180) for p in procs] == [0] * world
    return {r: torch.load(tmp_path / f"out{r}.pt", weights_only=False)[r] for r in range(world)}


def _join(rank: int, port: int, world: int) -> None:
    """A gloo group whose collectives time out after 60 s: a rank waiting for a collective its peer never issues
    fails the test instead of hanging it."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


def _reduce_rank(rank: int, port: int, world: int, out) -> None:
    """Rank 0: tables a and b with the same rows (fused), c empty. Rank 1: a alone, b with other rows, c."""
    _join(rank, port, world)
    g = torch.Generator().manual_seed(rank)
    rows = torch.unique(torch.randint(0, 10, (5 + 3 * rank,), generator=g))
    a = (rows, torch.randn(len(rows), 3, generator=g))
    b = (rows, torch.randn(len(rows), 1, generator=g)) if rank == 0 else \
        (torch.tensor([2, 8]), torch.randn(2, 1, generator=g))
    c = None if rank == 0 else (torch.tensor([4]), torch.ones(1, 2))
    shares = [-1, 0, -1] if rank == 0 else [-1, -1, -1]
    out[rank] = ((a, b, c), reduce_tables([a, b, c], [3, 1, 2], shares))
    dist.destroy_process_group()


@pytest.mark.integration
def test_the_mean_of_each_table_is_the_same_on_every_rank_whatever_each_rank_got(tmp_path):
    out = _spawn(_reduce_rank, tmp_path)
    (local0, got0), (local1, got1) = out[0], out[1]
    for t, dim in enumerate((3, 1, 2)):
        r0, v0 = got0[t]
        r1, v1 = got1[t]
        assert torch.equal(r0, r1) and torch.equal(v0, v1)  # bit-identical on both ranks
        dense = torch.zeros(10, dim)
        for local in (local0, local1):
            if local[t] is not None:
                dense.index_add_(0, *local[t])
        expected_rows = torch.unique(torch.cat([x[t][0] for x in (local0, local1) if x[t] is not None]))
        assert torch.equal(r0, expected_rows), t  # each row once, ascending (the C kernel's and torch's)
        torch.testing.assert_close(v0, dense[r0] / 2)


def _shared_rank(rank: int, port: int, world: int, out) -> None:
    """Both ranks: tables a and b looked up with one ids tensor (the same rows on each rank: fused in the exchange,
    their gathered rows sorted once for both)."""
    _join(rank, port, world)
    g = torch.Generator().manual_seed(10 + rank)
    rows = torch.unique(torch.randint(0, 10, (6,), generator=g))
    a, b = (rows, torch.randn(len(rows), 3, generator=g)), (rows, torch.randn(len(rows), 1, generator=g))
    out[rank] = ((a, b), reduce_tables([a, b], [3, 1], [-1, 0]))
    dist.destroy_process_group()


@pytest.mark.integration
def test_tables_sharing_their_rows_on_every_rank_get_the_mean_of_each(tmp_path):
    out = _spawn(_shared_rank, tmp_path)
    (local0, got0), (local1, got1) = out[0], out[1]
    for t, dim in enumerate((3, 1)):
        assert all(torch.equal(x, y) for x, y in zip(got0[t], got1[t]))  # bit-identical on both ranks
        dense = torch.zeros(10, dim)
        for local in (local0, local1):
            dense.index_add_(0, *local[t])
        rows, values = got0[t]
        assert torch.equal(rows, torch.unique(torch.cat([local0[t][0], local1[t][0]])))
        assert values.is_contiguous()
        torch.testing.assert_close(values, dense[rows] / 2)


def _plan(name: str, dim: int) -> TablePlan:
    return TablePlan(name=name, rows=20, dim=dim, location="host", optimizer="lazy_adam", lr=0.1,
                     betas=(0.9, 0.999), eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)


def _missed_table_rank(rank: int, port: int, world: int, out) -> None:
    """Two tables; at step 1 rank 1's batch does not reach table "users" at all (its forward never looks it up),
    at step 2 rank 0 looks "items" up twice with different ids. Three steps, then the weights."""
    _join(rank, port, world)
    init = {"items": torch.randn(20, 3, generator=torch.Generator().manual_seed(7)),
            "users": torch.randn(20, 2, generator=torch.Generator().manual_seed(8))}
    store = ReplicatedTables(init, (_plan("items", 3), _plan("users", 2)), torch.device("cpu"),
                             dp_group=dist.group.WORLD)
    for step in range(3):
        ids = torch.tensor([1, 4, 4, 9]) + rank + step
        loss = store.lookup("items", ids).square().sum()
        if not (step == 1 and rank == 1):
            loss = loss + store.lookup("users", ids).sum()
        if step == 2 and rank == 0:
            loss = loss + store.lookup("items", torch.tensor([0, 19])).sum()
        loss.backward()
        store.collect()
        assert store.step()
    out[rank] = {n: t.weight.clone() for n, t in store.tables.items()}
    dist.destroy_process_group()


def _reference_weights() -> dict:
    """The same three steps with both ranks' batches in one process (the mean of the two ranks' gradients)."""
    init = {"items": torch.randn(20, 3, generator=torch.Generator().manual_seed(7)),
            "users": torch.randn(20, 2, generator=torch.Generator().manual_seed(8))}
    params = {n: torch.nn.Parameter(w.clone()) for n, w in init.items()}
    optims = {n: torch.optim.SparseAdam([p], lr=0.1) for n, p in params.items()}
    for step in range(3):
        loss = 0
        for rank in (0, 1):
            ids = torch.tensor([1, 4, 4, 9]) + rank + step
            loss = loss + torch.nn.functional.embedding(ids, params["items"], sparse=True).square().sum()
            if not (step == 1 and rank == 1):
                loss = loss + torch.nn.functional.embedding(ids, params["users"], sparse=True).sum()
            if step == 2 and rank == 0:
                loss = loss + torch.nn.functional.embedding(torch.tensor([0, 19]), params["items"], sparse=True).sum()
        (loss / 2).backward()
        for n, o in optims.items():
            if params[n].grad is not None:
                o.step()
                params[n].grad = None
    return {n: p.detach() for n, p in params.items()}


@pytest.mark.integration
def test_a_batch_that_misses_a_table_on_one_rank_neither_hangs_nor_pairs_the_wrong_rows(tmp_path):
    out = _spawn(_missed_table_rank, tmp_path)
    reference = _reference_weights()
    for name in ("items", "users"):
        assert torch.equal(out[0][name], out[1][name]), name  # the copies stay bit-identical
        torch.testing.assert_close(out[0][name], reference[name], rtol=1e-5, atol=1e-6)
