"""Host tables against FBGEMM's fused CPU table-batched embedding (TBE) and torch's sparse EmbeddingBag: the
embedding work of one training step, interleaved in one invocation.

    .venv/bin/python bench/tbe_bench.py [--shape 26x1000000x16] [--batch 4096] [--rounds 3] [--steps 8]
                                        [--threads 1] [--variants sgd,fbgemm_sgd,...] [--out bench/results/tbe.txt]
                                        [--kernels] [--shared] [--malloc glibc]

``--kernels`` times the project's table kernels alone (``store.step()``: coalesce and update) at 1 and 2 threads,
alternating step by step in one process, --steps (default 20 there) of each per round (``kernel_threads``), and then
torch's own memory-bound and arithmetic ops the same way (``machine_ceiling``): what a second thread can give on this
machine. Before 2026-12-02 the thread counts alternated round by round, 8 steps each: a virtual machine's slow spells
then fell on one thread count and moved a round's ratio by +-0.3.

One step, for every variant: the pooled forward of every table (1 id per feature per sample, Zipf(1.05) ids over
the table's rows, a fresh batch each step), the backward of a fixed upstream gradient, and the sparse update of the
touched rows. The project's path is driven as the Trainer drives it: ``BagLookup`` modules standing where
``nn.EmbeddingBag`` tables were, ``store.collect()``, ``store.step()``. Variants:

- ``sgd``, ``adagrad``, ``rowwise_adagrad``, ``lazy_adam``, ``ftrl``: the project's replicated host store;
- ``fbgemm_sgd``, ``fbgemm_adagrad``, ``fbgemm_rowwise_adagrad``: FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``
  on the host (EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD), when ``fbgemm_gpu`` imports; its states (made
  by torch.zeros: pages the kernel maps at their first write, a fault per page in the timed steps) written once
  when built, as a long run has them (before 2026-11-29 evening they were not: FBGEMM's Adagrads measured 2-4x slow);
- ``torch_sgd``: one ``nn.EmbeddingBag(sparse=True)`` per table and ``torch.optim.SGD``;
- a project variant with ``_4k`` (``sgd_4k``): its tables left on 4 KiB pages (as ``HL_TABLE_HUGEPAGES=0``); the
  plain name runs as the ranks do, the tables moved onto transparent huge pages (launcher/tables/hugepages.py; the
  bench waits for the move before timing);
- an FBGEMM variant with ``_huge`` (``fbgemm_sgd_huge``): FBGEMM's host weights and states given the same huge pages
  (FBGEMM itself does not ask for them): what FBGEMM would do with the same memory.
The process's malloc is set as a recipe rank's (bench/rank_malloc.py: tcmalloc where installed, else glibc's as
launcher/worker/heap.py sets it; ``--malloc glibc`` keeps glibc's), for every variant, and said in the header.
A variant whose own tables and states would not fit in 85 % of the memory available is left out, with its size said
(``fitting``: lazy Adam and FTRL at 8 x 4 M x 64 hold 24 GiB); each report's header names the processor.

Each round of each variant runs in a fresh process of its own (``isolated``; since 2026-12-03: sharing one process, a
variant inherited memory another had freed). With ``--shared`` every variant runs in this process, built once and
kept while their tables fit in 70 % of the memory available (else each round builds
each variant afresh and frees it); each round runs --warmup steps of each variant, then times --steps; rounds
alternate the variants' order. Reported: per variant the median ms/step over rounds (each round's own median),
the spread (min-max of the round medians), bytes moved per step (rows read and written, states included) and that
rate against a measured copy bound, and each variant's ratio to its FBGEMM counterpart, round by round. Numbers
depend on the machine: see docs/performance.md for where they were taken.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.procfs import kernel_field  # noqa: E402
import rank_malloc  # noqa: E402  (bench/ is not a package)

PROJECT = ("sgd", "adagrad", "rowwise_adagrad", "lazy_adam", "ftrl")
FBGEMM = {"fbgemm_sgd": "EXACT_SGD", "fbgemm_adagrad": "EXACT_ADAGRAD",
          "fbgemm_rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD"}
AGAINST = {"sgd": "fbgemm_sgd", "adagrad": "fbgemm_adagrad", "rowwise_adagrad": "fbgemm_rowwise_adagrad",
           "lazy_adam": "fbgemm_adagrad", "ftrl": "fbgemm_adagrad", "torch_sgd": "fbgemm_sgd"}
STATE_FLOATS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 0, "lazy_adam": 2, "ftrl": 2, "fbgemm_sgd": 0,
                "fbgemm_adagrad": 1, "fbgemm_rowwise_adagrad": 0, "torch_sgd": 0}
LR = 0.01
MALLOC = ""
"""The process's malloc, in the words of a rank's log (main sets it: bench/rank_malloc.py)."""


def zipf_ids(n: int, rows: int, gen: torch.Generator, a: float = 1.05) -> torch.Tensor:
    """``n`` ids in [0, rows) drawn from a Zipf(a) law over ranks, the ranks scattered over the rows by a fixed
    permutation-like multiply (a hot row is not always row 0)."""
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    # inverse CDF of a continuous power law on [1, rows]: x = ((rows^(1-a) - 1) u + 1)^(1/(1-a))
    ranks = (((rows ** (1 - a) - 1) * u + 1) ** (1 / (1 - a))).long().clamp_(1, rows) - 1
    return (ranks * 2654435761) % rows


def batches(tables: int, rows: int, batch: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.stack([zipf_ids(batch, rows, gen) for _ in range(tables)]) for _ in range(count)]


def base_of(variant: str) -> str:
    """The variant a ``_4k``, ``_huge`` or ``_ebc`` variant is a form of (``sgd_4k`` -> ``sgd``)."""
    return variant.removesuffix("_4k").removesuffix("_huge").removesuffix("_ebc")


def state_floats(variant: str, dim: int) -> int:
    """Optimizer state floats a row of ``variant``'s tables holds."""
    base = base_of(variant)
    return STATE_FLOATS[base] * dim + (1 if "rowwise" in base else 0)


def project(optimizer: str, tables: int, rows: int, dim: int, huge: bool = True):
    """A replicated host store of ``tables`` tables and a BagLookup for each (as build_tables makes them), its host
    tables on huge pages (``huge``: as build_tables does it, waited for) or left on 4 KiB pages."""
    from launcher.plan.placement import TablePlan
    from launcher.tables import hugepages
    from launcher.tables.lookup import lookup_for
    from launcher.tables.replicated import ReplicatedTables

    plans = tuple(TablePlan(f"t{i:02d}", rows, dim, "host", optimizer, LR, (0.9, 0.999), 1e-8, 0.0, 0.0, -0.5, 0.1)
                  for i in range(tables))
    weights = {p.name: torch.empty(rows, dim).uniform_(-0.01, 0.01) for p in plans}
    store = ReplicatedTables(weights, plans, torch.device("cpu"))
    backing = hugepages.back(store.held()) if huge else None
    if backing is not None:
        backing.wait()
    like = nn.EmbeddingBag(1, dim, mode="sum", device="meta")
    like.num_embeddings = rows
    bags = [lookup_for(store, p.name, like) for p in plans]

    def step(ids: torch.Tensor, grad: torch.Tensor) -> None:
        out = torch.cat([bag(ids[t].view(-1, 1)) for t, bag in enumerate(bags)], dim=1)
        out.backward(grad)
        store.collect()
        store.step()
    step.bags = bags
    return step, store


def project_ebc(optimizer: str, tables: int, rows: int, dim: int):
    """A TorchRec EmbeddingBagCollection of ``tables`` tables (one feature each) whose tables build_tables moved into
    a replicated host store, as for a TorchRec user's model: its forward is then one call for every table
    (launcher/tables/lookup.py batch_collections); the KeyedJaggedTensor is built in the step, as FBGEMM's offsets."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from launcher.plan.placement import TablePlan
    from launcher.tables import build_tables

    with torch.device("meta"):  # its weights: the store's, made below (torchrec would initialise GBs first)
        ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=f"t{i:02d}", embedding_dim=dim, num_embeddings=rows,
                                                         feature_names=[f"f{i:02d}"]) for i in range(tables)])
    for bag in ebc.embedding_bags.values():
        bag.weight = nn.Parameter(torch.empty(rows, dim).uniform_(-0.01, 0.01))
    model = nn.ModuleDict({"ebc": ebc})
    plans = tuple(TablePlan(f"ebc.embedding_bags.t{i:02d}", rows, dim, "host", optimizer, LR, (0.9, 0.999), 1e-8,
                            0.0, 0.0, -0.5, 0.1) for i in range(tables))
    store = build_tables([model], plans, torch.device("cpu"), torch.float32)
    if store.huge_pages is not None:  # None: nothing large enough to back
        store.huge_pages.wait()
    keys = [f"f{i:02d}" for i in range(tables)]

    def step(ids: torch.Tensor, grad: torch.Tensor) -> None:
        kjt = KeyedJaggedTensor(keys=keys, values=ids.reshape(-1), lengths=torch.ones(ids.numel(), dtype=torch.int32))
        model["ebc"](kjt).values().backward(grad)
        store.collect()
        store.step()
    return step, store


def fbgemm(optimizer: str, tables: int, rows: int, dim: int, huge: bool = False):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
                                                                        SplitTableBatchedEmbeddingBagsCodegen)

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables,
        optimizer=getattr(EmbOptimType, optimizer), learning_rate=LR, eps=1e-8)
    held = [t for t in (*tbe.buffers(), *tbe.parameters()) if t.is_floating_point() and t.numel() >= 1 << 20]
    for t in held:  # its states come from torch.zeros: pages the kernel maps at the first write, a fault per page in
        t.data.add_(0)  # the timed steps (ours are written when made): written once here, as a long run has them
    if huge:
        from launcher.tables import hugepages
        hugepages.Backing(hugepages.spans(held), held).wait()

    def step(ids: torch.Tensor, grad: torch.Tensor) -> None:
        batch = ids.shape[1]
        offsets = torch.arange(tables * batch + 1, dtype=torch.int64)
        out = tbe(ids.reshape(-1), offsets)
        out.backward(grad)
    return step, tbe


def torch_sparse(tables: int, rows: int, dim: int):
    bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables))
    opt = torch.optim.SGD(bags.parameters(), lr=LR)

    def step(ids: torch.Tensor, grad: torch.Tensor) -> None:
        out = torch.cat([bag(ids[t].view(-1, 1)) for t, bag in enumerate(bags)], dim=1)
        out.backward(grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, bags


def build(variant: str, tables: int, rows: int, dim: int):
    base = base_of(variant)
    if base in PROJECT and variant.endswith("_ebc"):
        return project_ebc(base, tables, rows, dim)
    if base in PROJECT and not variant.endswith("_huge"):
        return project(base, tables, rows, dim, huge=not variant.endswith("_4k"))
    if base in FBGEMM and not variant.endswith("_4k"):
        return fbgemm(FBGEMM[base], tables, rows, dim, huge=variant.endswith("_huge"))
    if variant == "torch_sgd":
        return torch_sparse(tables, rows, dim)
    raise SystemExit(f"unknown variant {variant}; known: {', '.join([*PROJECT, *FBGEMM, 'torch_sgd'])}")


def copy_bound() -> float:
    """GB/s of a 256 MiB copy (median of 5), this process's threads."""
    src = torch.empty(64 << 20).uniform_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def step_bytes(variant: str, ids: torch.Tensor, dim: int) -> int:
    """Bytes a step must move at least: each looked-up id's row read once (forward), each unique row and its state
    read and written once (update)."""
    unique = sum(len(torch.unique(ids[t])) for t in range(ids.shape[0]))
    return 4 * (ids.numel() * dim + 2 * unique * (dim + state_floats(variant, dim)))


def table_bytes(variant: str, shape: tuple[int, int, int]) -> int:
    """Bytes a variant's tables and states hold."""
    tables, rows, dim = shape
    return 4 * tables * rows * (dim + state_floats(variant, dim))


def fitting(variants: list[str], shape: tuple[int, int, int]) -> list[str]:
    """The variants whose own tables and states fit in 85 % of the memory available now; each other one named with its
    size and left out (lazy Adam at 8 x 4 M x 64 holds 24 GiB: the kernel's OOM killer would end the whole bench).
    All of them where /proc/meminfo cannot be read."""
    room = kernel_field("/proc/meminfo", "MemAvailable")
    kept = [v for v in variants if not room or table_bytes(v, shape) < 0.85 * room]
    for v in (v for v in variants if v not in kept):
        print(f"{v} left out: its tables and states hold {table_bytes(v, shape) / 2**30:.1f} GiB, "
              f"{room / 2**30:.1f} GiB are available", flush=True)
    return kept


def machine() -> str:
    """The processor's model name and the CPUs this process may run on: the results file holds runs of several
    virtual machines."""
    name = "unknown processor"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            name = next((line.partition(":")[2].strip() for line in f if line.startswith("model name")), name)
    return f"{name}, {len(os.sched_getaffinity(0))} CPUs"


def timed(step, data: list[torch.Tensor], grad: torch.Tensor, warmup: int) -> float:
    """Median ms of the steps after ``warmup``."""
    times = []
    for i, ids in enumerate(data):
        t0 = time.perf_counter()
        step(ids, grad)
        rank_malloc.step_end()  # as a rank's Trainer after each step
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(variant: str, shape: tuple[int, int, int], batch: int, warmup: int, steps: int, built=None) -> float:
    """One round of ``variant``: ``built`` (its step, kept between rounds) or built afresh and freed after."""
    tables, rows, dim = shape
    step, keep = built or build(variant, tables, rows, dim)
    data = batches(tables, rows, batch, warmup + steps, seed=1)
    grad = torch.randn(batch, tables * dim, generator=torch.Generator().manual_seed(2))
    ms = timed(step, data, grad, warmup)
    if built is None:
        del step, keep
        gc.collect()
        rank_malloc.step_end()  # tcmalloc: the variant's tables back to the kernel before the next is built
    return ms


def kernel_threads(variants: list[str], shape: tuple[int, int, int], batch: int, rounds: int, warmup: int,
                   steps: int) -> str:
    """``--kernels``: the project's table kernels alone (``store.step()``: the coalesce of a step's gradients and the
    update of its rows; the forward, backward and collect run untimed before each) at 1 and at 2 threads, alternating
    step by step (``one_against_two``), in one process. The whole step is the default mode's, run with --threads 1
    and 2."""
    tables, rows, dim = shape
    lines = [f"# tbe_bench --kernels {'x'.join(map(str, shape))} batch {batch}, {rounds} rounds x {steps} steps at "
             f"each thread count, alternating step by step: store.step() alone; torch {torch.__version__}; "
             f"{machine()}; {MALLOC.split(' (')[0]}",
             f"{'variant':<24}{'1 thread ms':>12}{'2 threads ms':>14}   speed-up (rounds)"]
    for v in variants:
        step, store = build(v, tables, rows, dim)
        # an odd number of batches: each comes back under the other thread count on its next turn
        data = itertools.cycle(batches(tables, rows, batch, 2 * steps + 1, seed=1))
        grad = torch.randn(batch, tables * dim, generator=torch.Generator().manual_seed(2))
        timed = functools.partial(store_step, step, store, data, grad)
        for _ in range(warmup):
            timed()
        lines.append(speed_up(v, one_against_two(timed, rounds, steps)))
        del step, store, timed
        gc.collect()
        rank_malloc.step_end()
    return "\n".join(lines + machine_ceiling(shape, batch, rounds, steps))


def store_step(step, store, data, grad: torch.Tensor) -> float:
    """Seconds of one ``store.step()`` on the next batch of ``data`` (the forward, backward and collect untimed)."""
    ids = next(data)
    torch.cat([bag(ids[t].view(-1, 1)) for t, bag in enumerate(step.bags)], dim=1).backward(grad)
    store.collect()
    t0 = time.perf_counter()
    store.step()
    elapsed = time.perf_counter() - t0
    rank_malloc.step_end()  # untimed, as the forward
    return elapsed


def one_against_two(timed_step, rounds: int, steps: int) -> dict[int, list[float]]:
    """``alternating`` between 1 and 2 threads."""
    return alternating(timed_step, {n: functools.partial(torch.set_num_threads, n) for n in (1, 2)}, rounds, steps)


def alternating(timed_step, settings: dict, rounds: int, steps: int) -> dict:
    """Per key of ``settings`` (two: each a function that puts that setting in force), the median ms of each round's
    ``steps`` calls of ``timed_step()`` (seconds) under it, the setting switched at every call (the round's first call
    alternating), so that a machine that slows down or speeds up for a while (a virtual machine's neighbours) does it
    to both; the first round untimed."""
    keys = list(settings)
    per: dict = {k: [] for k in keys}
    for r in range(rounds + 1):
        times: dict = {k: [] for k in keys}
        for i in range(2 * steps):
            key = keys[(i + r) % 2]
            settings[key]()
            times[key].append(timed_step())
        if r:
            for key, ts in times.items():
                per[key].append(statistics.median(ts) * 1e3)
    return per


def speed_up(name: str, per: dict) -> str:
    """A report line: each of ``per``'s two settings' median ms, and the median and rounds of the first's over the
    second's."""
    first, second = per.values()
    ratios = [a / b for a, b in zip(first, second)]
    return (f"{name:<24}{statistics.median(first):>12.2f}{statistics.median(second):>14.2f}   "
            f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})")


def machine_ceiling(shape: tuple[int, int, int], batch: int, rounds: int, steps: int) -> list[str]:
    """What a second thread gives torch's own ops on this machine, interleaved the same way: the gather of the step's
    rows from tables of its shape (memory latency), an add over 256 MiB (memory bandwidth) and a matmul
    (arithmetic)."""
    tables, rows, dim = shape
    ids = batches(tables, rows, batch, 1, seed=1)[0]  # every table's rows, in one table of all of them
    table, ids = torch.randn(tables * rows, dim), (ids + rows * torch.arange(tables).view(-1, 1)).reshape(-1)
    big, square = torch.empty(64 << 20).uniform_(), torch.randn(1024, 1024)
    ops = {"torch index_select": lambda: torch.index_select(table, 0, ids), "torch add_ 256 MiB": lambda: big.add_(1),
           "torch matmul 1024^2": lambda: square @ square}
    lines = []
    for name, op in ops.items():
        def op_step(op=op) -> float:
            t0 = time.perf_counter()
            op()
            return time.perf_counter() - t0

        lines.append(speed_up(name, one_against_two(op_step, rounds, steps)))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="26x1000000x16", help="TABLESxROWSxDIM")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 8; 20 with --kernels)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="sgd,fbgemm_sgd,torch_sgd,adagrad,fbgemm_adagrad,rowwise_adagrad,"
                                          "fbgemm_rowwise_adagrad,lazy_adam,ftrl")
    ap.add_argument("--out", default="", help="append the report to this file")
    ap.add_argument("--kernels", action="store_true", help="the project's table kernels alone, 1 against 2 threads")
    ap.add_argument("--malloc", default="auto", help="launcher.malloc of the process (auto: as a rank's here)")
    ap.add_argument("--shared", action="store_true", help="every variant in this one process (default: each round "
                                                       "of each variant in a process of its own)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # isolated's child: one round of this variant
    args = ap.parse_args()
    global MALLOC
    MALLOC = rank_malloc.as_a_rank(args.malloc)  # the process's malloc as a recipe rank's, every variant alike
    print(MALLOC, flush=True)
    torch.set_num_threads(args.threads)
    shape = tuple(int(x) for x in args.shape.split("x"))
    variants = fitting([v for v in args.variants.split(",") if v], shape)
    if args.steps is None:
        args.steps = 20 if args.kernels else 8
    if args.one:  # isolated's child: one round of one variant, built here, its median ms on the last line
        print(measure(args.one, shape, args.batch, args.warmup, args.steps))
        return
    if args.kernels:
        report(kernel_threads([v for v in variants if base_of(v) in PROJECT], shape, args.batch, args.rounds,
                              args.warmup, args.steps), args.out)
        return
    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError as e:
        print(f"fbgemm_gpu does not import ({e}): its variants are left out")
        variants = [v for v in variants if base_of(v) not in FBGEMM]
    bound = copy_bound()
    sample = batches(shape[0], shape[1], args.batch, 1, seed=1)[0]
    results: dict[str, list[float]] = {v: [] for v in variants}
    # Every variant built once and kept, when they fit in 70 % of the memory available: a training process allocates
    # its tables once, and rebuilding 1-8 GB per variant and round left each round on pages in another state.
    resident = sum(table_bytes(v, shape) for v in variants) < 0.7 * kernel_field("/proc/meminfo", "MemAvailable")
    isolate = not args.shared
    resident = resident and not isolate
    built = {v: build(v, *shape) for v in variants} if resident else {}
    for v in built:  # one untimed round: the first steps of a variant kept are not its steady state
        measure(v, shape, args.batch, args.warmup, args.steps, built[v])
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            results[v].append(isolated(v, args) if isolate else
                              measure(v, shape, args.batch, args.warmup, args.steps, built.get(v)))
        print(f"round {r + 1}: " + ", ".join(f"{v} {results[v][-1]:.1f}" for v in variants), flush=True)
    lines = [f"# tbe_bench {args.shape} batch {args.batch}, {args.threads} thread(s), {args.rounds} rounds x "
             f"{args.steps} steps, variants "
             f"{'kept' if resident else 'each in a process of its own' if isolate else 'rebuilt each round'}; "
             f"copy bound {bound:.1f} GB/s; "
             f"torch {torch.__version__}; {machine()}; {MALLOC.split(' (')[0]}",
             f"{'variant':<24}{'median ms':>10}{'spread':>16}{'GB/s':>7}{'of copy':>8}   ratio to FBGEMM (rounds)"]
    for v in variants:
        med = statistics.median(results[v])
        rate = step_bytes(v, sample, shape[2]) / (med / 1e3) / 1e9
        ref = AGAINST.get(base_of(v))
        ratio = ""
        if ref in results and v != ref:
            per = [a / b for a, b in zip(results[v], results[ref])]
            ratio = (f"{med / statistics.median(results[ref]):.2f}x {ref} "
                     f"({', '.join(f'{x:.2f}' for x in per)})")
        spread = f"{min(results[v]):.1f}-{max(results[v]):.1f}"
        lines.append(f"{v:<24}{med:>10.1f}{spread:>16}{rate:>7.2f}{rate / bound:>8.1%}   {ratio}")
    report("\n".join(lines), args.out)


def isolated(variant: str, args: argparse.Namespace) -> float:
    """One round of ``variant`` in a fresh process (the default; ``--shared`` runs every variant in one): with the
    same malloc, threads, shape and batch, nothing of another variant's memory to inherit. Sharing one process, a
    variant run after another reused its freed memory: under glibc the room in the heap its blocks left (no page
    faults for a 32 MiB block), under tcmalloc the very pages, still on the transparent huge pages the store's tables
    were moved to (FBGEMM's SGD at 8 x 4 M x 64, batch 16,384: 13.0-15.6 ms after the store's variant, 17.5-18.1 ms
    in a process of its own)."""
    cmd = [sys.executable, __file__, "--one", variant, "--shape", args.shape, "--batch", str(args.batch),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--threads", str(args.threads),
           "--malloc", args.malloc]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def report(text: str, out: str) -> None:
    """Print ``text``; append it to ``out`` when given."""
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
