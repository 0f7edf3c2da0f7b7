"""Where a host-table step's time goes, at 1 and 2 threads: ``store.step()`` of tbe_bench's project variants split
into its parts, the thread counts interleaved in one process.

    .venv/bin/python bench/table_step_phases.py [--variant sgd] [--shape 26x1000000x16] [--batch 4096] [--rounds 5]

Parts, as ReplicatedTables.step runs them on one rank (no exchange): ``coalesce`` (``_local``: the step's lookups
grouped and summed per row, one kernel call, which since 2026-12-01 17:40 also checks that the sums are finite),
``update`` (every table's optimizer update: one kernel call for all the tables since the evening of 2026-12-01, one
call a table before) and ``step`` (the two). Timed for comparison, not part of a one-rank step: ``finite`` (the
finiteness check of every table's sums as a call of its own, as a step of several ranks makes it on the exchanged
sums, and as every step made it before) and ``finite per table`` (that check called once per table, as before the
morning of 2026-12-01). ``rows read`` is a reference, not
part of the step: the step's unique rows of every table read in one call over the same threads (kernels.c
hl_pool_many, the batched forward's kernel, on the rows the update writes): what this machine gives a second thread
on random rows alone, against which the update's and the step's speed-ups can be read.
Each round times ``--steps`` steps per thread count (the forward, backward and collect before each untimed) and
keeps the median; the table shows the median of the rounds' medians and the speed-up of 2 threads over 1. Appends
to bench/results/table_step_phases.txt. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tbe_bench  # noqa: E402  (bench/ is not a package)

from launcher.tables import kernels  # noqa: E402
from launcher.tables.row_update import step_all  # noqa: E402

PARTS = ("coalesce", "finite", "finite per table", "update", "step", "rows read")


def read_sets(tables: int, rows: int, batch: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Per step, (ids, offsets, bags) for ``rows_read``: every table's unique rows of a batch drawn apart from the
    trained ones (rows no update of the timed steps just wrote, so not in cache for that reason), the same number
    of rows a table (the fewest any has), each a bag of one row."""
    out = []
    for ids in tbe_bench.batches(tables, rows, batch, count, seed=3):
        unique = [torch.unique(ids[t]) for t in range(tables)]
        bags = min(len(u) for u in unique)
        flat = torch.cat([u[:bags] for u in unique])
        out.append((flat, torch.arange(len(flat) + 1), bags))
    return out


def rows_read(store, read: tuple[torch.Tensor, torch.Tensor, int]) -> None:
    """Read every table's rows of ``read`` in one call over the rank's threads (kernels.pool_many)."""
    tables = [t.weight for t in store.tables.values()]
    ids, offsets, bags = read
    kernels.pool_many(tables, list(range(len(tables))), ids, offsets, bags)


def timed_steps(step, store, data: list[torch.Tensor], grad: torch.Tensor, warmup: int,
                reads: list[tuple[torch.Tensor, torch.Tensor, int]]) -> dict[str, float]:
    """The median ms of each part over the steps after ``warmup``."""
    times: dict[str, list[float]] = {p: [] for p in PARTS}
    for i, ids in enumerate(data):
        torch.cat([bag(ids[t].view(-1, 1)) for t, bag in enumerate(step.bags)], dim=1).backward(grad)
        store.collect()
        t0 = time.perf_counter()
        local, _, checked = store._local()
        sums = [r[1] for r in local if r is not None]
        t1 = time.perf_counter()
        finite = kernels.all_finite(sums)
        t2 = time.perf_counter()
        each = all(kernels.all_finite([s]) for s in sums)
        t3 = time.perf_counter()
        assert finite and each and checked
        step_all([(t.optimizer, r[0], r[1].contiguous())
                  for t, r in zip(store.tables.values(), local) if r is not None])
        t4 = time.perf_counter()
        rows_read(store, reads[i])
        t5 = time.perf_counter()
        if i >= warmup:
            for part, ms in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, (t1 - t0) + (t4 - t3), t5 - t4)):
                times[part].append(ms * 1e3)
    return {p: statistics.median(v) for p, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="sgd", choices=sorted(tbe_bench.PROJECT))
    ap.add_argument("--shape", default="26x1000000x16", help="TABLESxROWSxDIM")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "table_step_phases.txt"))
    args = ap.parse_args()
    tables, rows, dim = map(int, args.shape.split("x"))
    step, store = tbe_bench.build(args.variant, tables, rows, dim)
    data = tbe_bench.batches(tables, rows, args.batch, args.warmup + args.steps, seed=1)
    reads = read_sets(tables, rows, args.batch, len(data))
    grad = torch.randn(args.batch, tables * dim, generator=torch.Generator().manual_seed(2))
    per: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for r in range(args.rounds + 1):  # the first round untimed; the thread counts alternate which goes first
        for threads in ((1, 2) if r % 2 == 0 else (2, 1)):
            torch.set_num_threads(threads)
            got = timed_steps(step, store, data, grad, args.warmup, reads)
            if r:
                per[threads].append(got)
    lines = [f"# table_step_phases {args.variant} {args.shape} batch {args.batch}, {args.rounds} rounds x "
             f"{args.steps} steps, {time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}",
             f"{'part':<18}{'1 thread ms':>12}{'2 threads ms':>14}   speed-up (rounds)"]
    for part in PARTS:
        one, two = ([x[part] for x in per[n]] for n in (1, 2))
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(one, two))
        lines.append(f"{part:<18}{statistics.median(one):>12.2f}{statistics.median(two):>14.2f}   "
                     f"{statistics.median(one) / statistics.median(two):.2f}x ({ratios})")
    text = "\n".join(lines)
    print(text)
    with open(args.out, "a") as f:
        f.write(text + "\n\n")


if __name__ == "__main__":
    main()
