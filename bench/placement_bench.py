"""Host placement benchmark (issue 3): wide_deep with big tables, side by side in one invocation.

    .venv/bin/python bench/placement_bench.py [--rows 4000000] [--batch 4096] [--steps 30]

Prints a markdown table and writes bench/results/placement.json (placement_only.json with --only, which runs the
hand sparse loop and the runs named). Rows:
  hand sparse      the best hand-written loop: the same WideDeep and data, lazy Adam (torch SparseAdam) on both tables,
                   dense Adam(fused) on the rest, no launcher, one process with all cores
  hand dense       the same model with dense embeddings and dense Adam (foreach, torch's default; and fused)
  launcher sparse  hetero-launch recipe=wide_deep placement.host_device_mix=1 (1 rank, all cores; lazy Adam on
                   both tables so the math equals "hand sparse"): with torch's SparseAdam (the same loop as
                   "hand sparse", so launcher overhead shows) and with our row-fused lazy Adam (the gain);
                   also 2 ranks, and the recipe's default (FTRL on the wide table)
                   each of the last two also with HL_TABLE_KERNELS=torch (the table store on torch's ops, as before
                   launcher/tables/kernels.c: the kernels' gain)
  launcher dense   hetero-launch with tables.*.optimizer=dense (the dense baseline through the launcher)
  hand sparse, tcmalloc preloaded: the hand loop in a process started with tcmalloc, where the launcher's ranks
                   preload it (launcher.malloc=auto); and the recipe default with launcher.malloc=glibc
  bound            random row gathers from the table: uniform ids, and the recipe's skewed (log-uniform) ids
Not a test: numbers depend on the machine. Step time excludes the first warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from launcher.facts.malloc import find_allocators
from launcher.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
FIELDS = 26


def hand_loop(rows_per: int, batch: int, steps: int, warmup: int, sparse: bool, fused_dense: bool) -> dict:
    from launcher.recipes.wide_deep import SyntheticDataConfig
    from launcher.recipes.wide_deep.data import SyntheticCTR
    from launcher.recipes.wide_deep.model import WideDeep

    torch.manual_seed(0)
    model = WideDeep(13, FIELDS, rows_per, 16, [256, 128])
    # the recipe's data as its schema makes it (3 field pairs with joint effects: 0.7 ms of a step's 3.2 to draw)
    data = SyntheticCTR(13, FIELDS, rows_per, 0, interactions=SyntheticDataConfig().interactions)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    if sparse:
        tables = [model.deep_embedding, model.wide_embedding]
        for emb in tables:
            emb.sparse = True
        table_ids = {id(emb.weight) for emb in tables}
        table_opt = torch.optim.SparseAdam([emb.weight for emb in tables], lr=1e-3)
        dense_opt = torch.optim.Adam([p for p in model.parameters() if id(p) not in table_ids], lr=1e-3, fused=True)
        opts = [table_opt, dense_opt]
    else:
        opts = [torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused_dense or None)]
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        (dense, ids), labels = data.global_micro_batch(step, batch, 1)
        loss = loss_fn(model(dense, ids), labels)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts:
            o.step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times[warmup:]) * 1000
    return {"ms_per_step": ms, "samples_per_s": batch / ms * 1000, "lookups_per_s": batch * FIELDS / ms * 1000}


def launcher_run(rows_per: int, batch: int, steps: int, warmup: int, nproc: int, extra: list[str],
                 env: dict[str, str] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "recipe=wide_deep", f"model.rows_per_table={rows_per}", f"batch.global_size={batch}",
            f"cluster.nproc_per_node={nproc}", f"trainer.steps={warmup + steps}", "trainer.log_every=1",
            "trainer.checkpoint_every=-1", "eval.batches=0", *extra,
        ]
        res = subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=tmp, capture_output=True, text=True,
                             env={**os.environ, **(env or {})})
        if res.returncode != 0:
            raise RuntimeError(res.stdout[-2000:] + res.stderr[-2000:])
        records = RunDir(Path(tmp) / "log_output" / "latest").rank(0).read_metrics()
    # samples_per_s of each logged step (log_every=1): one step each; skip warm-up.
    rates = [r["samples_per_s"] for r in records if "event" not in r and r["step"] > warmup]
    sps = statistics.median(rates)
    return {"ms_per_step": batch / sps * 1000, "samples_per_s": sps, "lookups_per_s": sps * FIELDS}


def hand_loop_preloaded(library: str, rows_per: int, batch: int, steps: int, warmup: int) -> dict:
    """hand_loop (sparse) in a process of its own started with ``library`` in LD_PRELOAD: the hand loop with the
    allocator the launcher's ranks preload (launcher.malloc), which a user may preload too."""
    res = subprocess.run([sys.executable, __file__, "--hand-json", f"{rows_per},{batch},{steps},{warmup}"],
                         capture_output=True, text=True, env={**os.environ, "LD_PRELOAD": library}, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def gather_bound(rows_per: int, batch: int, skewed: bool) -> float:
    """Row lookups/s of a plain gather from a (rows x 16) fp32 table: the floor of any lookup."""
    table = torch.randn(rows_per * FIELDS, 16)
    if skewed:
        ids = (torch.pow(float(rows_per), torch.rand(batch, FIELDS)).long() - 1) + torch.arange(FIELDS) * rows_per
    else:
        ids = torch.randint(0, rows_per * FIELDS, (batch, FIELDS))
    ids = ids.reshape(-1)
    table.index_select(0, ids)
    t0 = time.perf_counter()
    for _ in range(20):
        table.index_select(0, ids)
    return ids.numel() * 20 / (time.perf_counter() - t0)


def table_update_ms(rows_per: int, batch: int, reps: int) -> dict[str, float]:
    """One host update of the deep table (rows x 16) for one batch's coalesced gradient, per optimizer, interleaved."""
    from launcher.tables.sparse_comm import coalesce
    from launcher.tables.sparse_optim import LazyAdam, SparseAdam, SparseFTRL

    n = rows_per * FIELDS
    ids = (torch.pow(float(rows_per), torch.rand(batch, FIELDS)).long() - 1) + torch.arange(FIELDS) * rows_per
    rows, grads = coalesce(ids.reshape(-1), torch.randn(ids.numel(), 16))
    opts = {
        "torch SparseAdam": SparseAdam(torch.randn(n, 16), 1e-3),
        "row-fused lazy Adam": LazyAdam(torch.randn(n, 16), 1e-3),
        "FTRL": SparseFTRL(torch.zeros(n, 16), 0.05),
    }
    times: dict[str, list[float]] = {k: [] for k in opts}
    for rep in range(reps + 2):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            opt.step(rows, grads)
            if rep >= 2:
                times[name].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()} | {"unique_rows": rows.numel()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows per table (all 26 fields together)")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="each run this many times, interleaved; median reported")
    ap.add_argument("--only", default="", help="words separated by |: only the runs whose name has one of them "
                                              "(the hand sparse loop, the baseline, always runs)")
    ap.add_argument("--hand-json", default="", help=argparse.SUPPRESS)  # ROWS_PER,BATCH,STEPS,WARMUP: one hand loop
    a = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if a.hand_json:
        print(json.dumps(hand_loop(*(int(x) for x in a.hand_json.split(",")), True, False)))
        return
    rows_per = a.rows // FIELDS
    tcmalloc = dict(find_allocators()).get("tcmalloc", "")
    lazy_both = ["placement.host_device_mix=1", "tables.wide_embedding.optimizer=lazy_adam",
                 "tables.wide_embedding.lr=0.001"]
    dense = ["tables.deep_embedding.optimizer=dense", "tables.wide_embedding.optimizer=dense"]
    sparse_adam = [*lazy_both, "tables.deep_embedding.optimizer=sparse_adam", "tables.wide_embedding.optimizer=sparse_adam"]
    runs = {
        "hand sparse (SparseAdam + fused Adam)": lambda: hand_loop(rows_per, a.batch, a.steps, a.warmup, True, False),
        "launcher, host tables, torch SparseAdam, 1 rank": lambda: launcher_run(rows_per, a.batch, a.steps, a.warmup, 1, sparse_adam),
        "launcher, host tables, row-fused lazy Adam, 1 rank": lambda: launcher_run(rows_per, a.batch, a.steps, a.warmup, 1, lazy_both),
        "launcher, host tables, row-fused lazy Adam, 2 ranks": lambda: launcher_run(rows_per, a.batch, a.steps, a.warmup, 2, lazy_both),
        "launcher, host tables, recipe default (lazy Adam + FTRL), 1 rank": lambda: launcher_run(rows_per, a.batch, a.steps, a.warmup, 1, ["placement.host_device_mix=1"]),
        "launcher, host tables, recipe default, glibc malloc (launcher.malloc=glibc), 1 rank": lambda: launcher_run(
            rows_per, a.batch, a.steps, a.warmup, 1, ["placement.host_device_mix=1", "launcher.malloc=glibc"]),
        "launcher, host tables, recipe default, torch ops (HL_TABLE_KERNELS=torch), 1 rank": lambda: launcher_run(
            rows_per, a.batch, a.steps, a.warmup, 1, ["placement.host_device_mix=1"], {"HL_TABLE_KERNELS": "torch"}),
        "launcher, host tables, row-fused lazy Adam, torch ops (HL_TABLE_KERNELS=torch), 1 rank": lambda: launcher_run(
            rows_per, a.batch, a.steps, a.warmup, 1, lazy_both, {"HL_TABLE_KERNELS": "torch"}),
        "hand dense (Adam foreach)": lambda: hand_loop(rows_per, a.batch, a.steps, a.warmup, False, False),
        "hand dense (Adam fused)": lambda: hand_loop(rows_per, a.batch, a.steps, a.warmup, False, True),
        "launcher dense, 1 rank": lambda: launcher_run(rows_per, a.batch, a.steps, a.warmup, 1, dense),
    }
    if tcmalloc:  # the hand loop with the allocator the ranks preload here (a user may preload it too)
        runs["hand sparse, tcmalloc preloaded"] = lambda: hand_loop_preloaded(tcmalloc, rows_per, a.batch, a.steps,
                                                                              a.warmup)
    if a.only:
        words = [w for w in a.only.split("|") if w]
        runs = {k: v for k, v in runs.items() if k.startswith("hand sparse") or any(w in k for w in words)}
    samples: dict[str, list[dict]] = {k: [] for k in runs}
    for r in range(a.rounds):  # interleaved, so a slow minute of the machine hits every run alike
        for name, fn in runs.items():
            samples[name].append(fn())
            print(f"round {r + 1}/{a.rounds}: {name}: {samples[name][-1]['ms_per_step']:.1f} ms/step", file=sys.stderr)
    rows = {k: sorted(v, key=lambda x: x["ms_per_step"])[len(v) // 2]
            for k, v in samples.items()}
    base = rows["hand sparse (SparseAdam + fused Adam)"]["samples_per_s"]
    bound_uniform = gather_bound(rows_per, a.batch, skewed=False)
    bound_skewed = gather_bound(rows_per, a.batch, skewed=True)
    print(f"\nwide_deep, {rows_per * FIELDS:,} rows per table (d=16 and d=1), batch {a.batch}, {FIELDS} fields, "
          f"{len(os.sched_getaffinity(0))} cores; per run the median of {a.steps} steps after {a.warmup} warm-up, "
          f"then the median of {a.rounds} interleaved rounds\n")
    print("| run | ms/step | samples/s | vs hand sparse | lookups/s | vs gather bound (skewed ids) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['ms_per_step']:.1f} | {r['samples_per_s']:,.0f} | {r['samples_per_s'] / base:.2f}x | "
              f"{r['lookups_per_s'] / 1e6:.2f} M | {r['lookups_per_s'] / bound_skewed:.1%} |")
    upd = table_update_ms(rows_per, a.batch, reps=20)
    print(f"\nhost update of the deep table for one batch ({upd['unique_rows']:,} unique rows × 16), median of 20: "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in upd.items() if k != "unique_rows")
          + f" (row-fused vs SparseAdam: {upd['torch SparseAdam'] / upd['row-fused lazy Adam']:.2f}x)")
    print(f"\ngather bound: {bound_uniform / 1e6:.1f} M rows/s with uniform ids, {bound_skewed / 1e6:.1f} M rows/s "
          f"with the recipe's skewed ids (index_select of 16-float rows)")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / ("placement.json" if not a.only else "placement_only.json")).write_text(json.dumps(
        {"args": vars(a), "runs": rows, "all_rounds": samples, "table_update_ms": upd, "gather_bound_uniform": bound_uniform, "gather_bound_skewed": bound_skewed},
        indent=2))


if __name__ == "__main__":
    main()
