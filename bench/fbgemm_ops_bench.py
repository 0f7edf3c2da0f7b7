"""Would FBGEMM's CPU kernels speed up the project's host tables? FBGEMM's backward-and-update op run on the
store's own tables, against the store's step, interleaved step by step in one process.

    .venv/bin/python bench/fbgemm_ops_bench.py [--shape 26x1000000x16] [--batch 4096] [--rounds 3] [--steps 12]
                                               [--threads 1] [--optimizers sgd,adagrad,rowwise_adagrad]
                                               [--out bench/results/fbgemm_ops.txt]

Issue 43 asks that, with ``fbgemm-gpu-cpu`` installed, SGD, Adagrad and row-wise Adagrad tables run on FBGEMM's
kernels where that is faster. FBGEMM's table-batched module owns its weights (one flat buffer for all its tables);
the store's tables are the model's own tensors, looked up one module at a time, so what the store could hand FBGEMM
is the op its module's backward calls (``torch.ops.fbgemm.split_embedding_backward_codegen_<optimizer>_cpu``), on
each table. Per step, after the same forward, backward and ``store.collect()`` (untimed), one of:

- ``store.step()``: the project's path (the coalesce of each table's gradients, their finiteness check, the update);
- ``fbgemm, raw ids``: FBGEMM's op per table on the step's raw ids and that table's gradient: its sort, sums and
  update, the same work from the step's ids to updated rows (without the finiteness check the store makes);
- ``fbgemm, coalesced rows``: FBGEMM's op per table on the store's coalesced (rows, sums): its update alone, as a
  store would call it behind the exchange of several ranks (the coalesce not counted here).

Each updates the same tables in turn (the values drift apart from one path's, which does not change the time).
Reported: the median ms of each over the rounds' medians, the spread, and each FBGEMM line's ratio to
``store.step()``. Appends to --out. Not a test: numbers depend on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tbe_bench  # noqa: E402
from rank_malloc import as_a_rank  # noqa: E402

PATHS = ("store.step()", "fbgemm, raw ids", "fbgemm, coalesced rows")


class FbgemmOp:
    """FBGEMM's CPU backward-with-update of one optimizer, called on one of the store's tables at a time: the table
    as FBGEMM's ``host_weights`` of a single table (offset 0, width ``dim``), its optimizer state as ``momentum1``."""

    def __init__(self, optimizer: str, rows: int, dim: int) -> None:
        importlib.import_module("fbgemm_gpu")  # registers torch.ops.fbgemm

        self.optimizer, self.dim = optimizer, dim
        self.op = getattr(torch.ops.fbgemm, f"split_embedding_backward_codegen_{optimizer}_cpu")
        self.zero = torch.zeros(1, dtype=torch.int64)
        self.placements = torch.zeros(1, dtype=torch.int32)
        self.d_offsets = torch.tensor([0, dim], dtype=torch.int32)
        self.hash_cumsum = torch.tensor([0, rows], dtype=torch.int64)
        self.bits = rows.bit_length() + 1
        self.lr = torch.tensor(tbe_bench.LR)

    def __call__(self, weight: torch.Tensor, state: torch.Tensor | None, ids: torch.Tensor,
                 grad: torch.Tensor) -> None:
        """Update ``weight`` (and ``state``) by ``grad``: one bag of one id a row of ``ids``."""
        offsets = torch.arange(ids.numel() + 1, dtype=torch.int64)
        args = [grad, weight.view(-1), self.placements, self.zero, self.d_offsets, self.dim, self.hash_cumsum,
                self.bits, ids, offsets, 0, torch.empty(0), False]
        if state is None:  # EXACT_SGD
            self.op(*args, self.lr)
        else:
            self.op(*args, state.reshape(-1), self.placements, self.zero, self.lr, eps=1e-8)


def one_round(optimizer: str, shape: tuple[int, int, int], batch: int, steps: int, built) -> dict[str, float]:
    """Median ms of each of PATHS over ``steps`` steps (2 warm-up steps first), the paths alternating each step."""
    tables, rows, dim = shape
    step, store = built
    op = FbgemmOp(optimizer, rows, dim)
    held = [(t.weight, (t.optimizer.state_tensors() or [None])[0]) for t in store.tables.values()]
    grad = torch.randn(batch, tables * dim, generator=torch.Generator().manual_seed(2))
    times: dict[str, list[float]] = {p: [] for p in PATHS}

    def forward_backward(ids: torch.Tensor) -> None:
        out = torch.cat([bag(ids[t].view(-1, 1)) for t, bag in enumerate(step.bags)], dim=1)
        out.backward(grad)
        store.collect()

    for i, ids in enumerate(tbe_bench.batches(tables, rows, batch, steps + 2, seed=1)):
        forward_backward(ids)
        t0 = time.perf_counter()
        store.step()
        ours = time.perf_counter() - t0
        grads = [grad[:, t * dim:(t + 1) * dim].contiguous() for t in range(tables)]  # FBGEMM's layout, untimed
        t0 = time.perf_counter()
        for (weight, state), g, t in zip(held, grads, range(tables)):
            op(weight, state, ids[t].contiguous(), g)
        raw = time.perf_counter() - t0
        forward_backward(ids)
        local, _, _ = store._local()  # the store's coalesced rows and sums, as its step makes them
        t0 = time.perf_counter()
        for (weight, state), (r, s) in zip(held, local):
            op(weight, state, r, s.contiguous())
        coalesced = time.perf_counter() - t0
        if i >= 2:
            for p, v in zip(PATHS, (ours, raw, coalesced)):
                times[p].append(v * 1e3)
    return {p: statistics.median(v) for p, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="26x1000000x16", help="TABLESxROWSxDIM")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--optimizers", default="sgd,adagrad,rowwise_adagrad")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fbgemm_ops.txt"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(as_a_rank(), flush=True)  # the process's malloc as a recipe rank's
    shape = tuple(int(x) for x in args.shape.split("x"))
    lines = [f"# fbgemm_ops_bench {args.shape} batch {args.batch}, {args.threads} thread(s), {args.rounds} rounds x "
             f"{args.steps} steps, {time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}",
             f"{'optimizer':<17}{'path':<24}{'median ms':>10}{'spread':>14}   ratio to store.step() (rounds)"]
    for optimizer in args.optimizers.split(","):
        built = tbe_bench.project(optimizer, *shape)
        rounds = [one_round(optimizer, shape, args.batch, args.steps, built) for _ in range(args.rounds)]
        del built
        for p in PATHS:
            ms = [r[p] for r in rounds]
            ours = statistics.median(r[PATHS[0]] for r in rounds)
            ratios = ", ".join(f"{r[p] / r[PATHS[0]]:.2f}" for r in rounds)
            ratio = "" if p == PATHS[0] else f"{statistics.median(ms) / ours:.2f}x ({ratios})"
            spread = f"{min(ms):.2f}-{max(ms):.2f}"
            lines.append(f"{optimizer:<17}{p:<24}{statistics.median(ms):>10.2f}{spread:>14}   {ratio}")
        print("\n".join(lines[-3:]), flush=True)
    tbe_bench.report("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
