"""Sparse gradient all-reduce over 2 real gloo processes: the mean, identical on every rank."""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from launcher.worker.sparse_comm import allreduce_sparse_mean, coalesce


def test_coalesce_sums_duplicates_in_row_order():
    rows, values = coalesce(torch.tensor([5, 1, 5, 3, 1]), torch.arange(10.0).reshape(5, 2))
    assert rows.tolist() == [1, 3, 5]
    assert values.tolist() == [[10.0, 12.0], [6.0, 7.0], [4.0, 6.0]]


def _rank(rank: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(rank)
    count = 5 + 3 * rank  # ranks contribute different numbers of rows
    rows = torch.randint(0, 10, (count,), generator=g)
    values = torch.randn(count, 3, generator=g)
    r, v = allreduce_sparse_mean(rows, values)
    out[rank] = (rows, values, r, v)
    dist.destroy_process_group()


def test_two_ranks_get_the_same_mean():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.start_processes(_rank, args=(port, out), nprocs=2, start_method="spawn")
    (rows0, vals0, r0, v0), (rows1, vals1, r1, v1) = out[0], out[1]
    assert torch.equal(r0, r1) and torch.equal(v0, v1)  # bit-identical on both ranks
    dense = torch.zeros(10, 3)
    dense.index_add_(0, rows0, vals0)
    dense.index_add_(0, rows1, vals1)
    expected_rows = torch.unique(torch.cat([rows0, rows1]))
    assert torch.equal(r0, expected_rows)
    torch.testing.assert_close(v0, dense[expected_rows] / 2)
