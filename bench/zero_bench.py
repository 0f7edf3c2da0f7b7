"""FSDP2 against DeepSpeed on the same gpt job: where both parts can compile one intent, which is faster here.

    .venv/bin/python bench/zero_bench.py [--rounds 3] [--steps 60] [--width 256] [--layers 4]

Pairs, each the same job through hetero-launch on 2 ranks (gpt at the given width and depth, global batch 32 of
64-token sequences, 1 micro-batch), differing only in parallel.data_parallel:
  ZeRO-2               zero.stage=2                           deepspeed | fsdp
  ZeRO-3               zero.stage=3                           deepspeed | fsdp
  optimizer on the CPU optimizer.target=CPU (ZeRO-2 offload)  deepspeed | fsdp (CPUOffloadPolicy)
  bf16                 precision=bf16 (zero.stage=0)          deepspeed | fsdp (MixedPrecisionPolicy, replicated)
Runs are interleaved (every variant once per round); step time = the median over 10-step windows after the first
10 steps (metrics.jsonl's wall_s), per run; the table gives the median over rounds, the spread (min-max over rounds)
and fsdp / deepspeed. Not a test: the figures belong to the machine (2 shared cores here). parallel.data_parallel=auto
takes the measured winner of each pair on plain data parallelism (launcher/parallel/choose.py).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from pipeline_bench import run  # bench/ is on sys.path when this file runs

PAIRS = {
    "ZeRO-2": ["zero.stage=2"],
    "ZeRO-3": ["zero.stage=3"],
    "optimizer on the CPU (ZeRO-2 offload)": ["optimizer.target=CPU"],
    "bf16 (zero.stage=0)": ["precision=bf16"],
}
PARTS = ("deepspeed", "fsdp")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    base = ["recipe=gpt", f"model.width={args.width}", f"model.layers={args.layers}", "model.heads=4",
            f"trainer.steps={args.steps}", "batch.global_size=32", "cluster.nproc_per_node=2"]
    times: dict[tuple[str, str], list[float]] = {(p, d): [] for p in PAIRS for d in PARTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (pair, part) in enumerate(times):
                overrides = [*base, *PAIRS[pair], f"parallel.data_parallel={part}"]
                times[(pair, part)].append(run(tmp, f"r{r}v{i}", overrides, 10))
    params = 12 * args.layers * args.width**2  # blocks' weights, about; embeddings aside
    print(f"gpt width {args.width}, {args.layers} blocks (~{params / 1e6:.1f} M parameters in the blocks), 2 ranks, "
          f"global batch 32, {args.steps} steps, {args.rounds} interleaved rounds\n")
    print("| intent | deepspeed: step time [spread] | fsdp: step time [spread] | fsdp / deepspeed |")
    print("|---|---:|---:|---:|")
    for pair in PAIRS:
        ds, fs = times[(pair, "deepspeed")], times[(pair, "fsdp")]

        def cell(t: list[float]) -> str:
            return f"{statistics.median(t) * 1000:.1f} ms [{min(t) * 1000:.1f}-{max(t) * 1000:.1f}]"

        print(f"| {pair} | {cell(ds)} | {cell(fs)} | {statistics.median(fs) / statistics.median(ds):.2f}x |")


if __name__ == "__main__":
    main()
