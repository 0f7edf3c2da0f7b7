"""Pipeline and tensor-parallel step time against one process, with the bubble fraction (P-1)/(M+P-1) beside it.

    .venv/bin/python bench/pipeline_bench.py [--rounds 3] [--steps 60] [--recipe gpt]

Variants, run interleaved (a, b, c, ..., a, b, c, ...) through hetero-launch, each at the same global batch and the
same micro-batches (one process accumulates them):
  one process      cluster.nproc_per_node=1, grad_accum M
  pipeline M=4     2 ranks, 2 stages, 4 micro-batches per step
  pipeline M=8     2 ranks, 2 stages, 8 micro-batches per step
  tensor parallel  2 ranks, tp 2 (the recipe's tensor-parallel plan), M micro-batches accumulated (gpt only)
  data parallel    2 ranks, torch DDP, for reference
Step time = the median over 10-step windows after the first 10 steps (metrics.jsonl's wall_s), per run; the table
gives the median over rounds, the spread (min-max over rounds) and the ratio to one process. With 2 stages the
ideal pipeline time is (M+P-1)/(M·P) of one process (P·M/(M+P-1) faster); what is left is send/recv and the
schedule's overhead. Not a test: the figures belong to the machine (2 shared cores here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent


def step_time(run_dir: Path, window: int) -> float:
    """Median seconds per step over the run's logged windows after the first one."""
    rows = [json.loads(line) for line in (run_dir / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "event" not in r and r["step"] % window == 0]
    times = [(b["wall_s"] - a["wall_s"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:])]
    return statistics.median(times)


def run(cwd: str, name: str, overrides: list[str], window: int) -> float:
    cmd = [str(BIN / "hetero-launch"), *overrides, f"output.run_name={name}", "trainer.checkpoint_every=-1",
           "eval.batches=0", f"trainer.log_every={window}"]
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return step_time(Path(cwd) / "log_output" / name, window)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--recipe", default="gpt")
    args = ap.parse_args()
    base = [f"recipe={args.recipe}", f"trainer.steps={args.steps}", "batch.global_size=32", "batch.micro_size=-1"]
    variants = {
        "one process (M=4 accumulated)": ([*base, "cluster.nproc_per_node=1", "batch.grad_accum=4",
                                           "parallel.pipeline_stages=1"], None),
        "pipeline 2 stages, M=4": ([*base, "cluster.nproc_per_node=2", "parallel.pipeline_stages=2",
                                    "batch.micro_batches=4"], (2, 4)),
        "pipeline 2 stages, M=8": ([*base, "cluster.nproc_per_node=2", "parallel.pipeline_stages=2",
                                    "batch.micro_batches=8"], (2, 8)),
        "data parallel 2 ranks (DDP)": ([*base, "cluster.nproc_per_node=2", "batch.grad_accum=2",
                                         "parallel.pipeline_stages=1"], None),
    }
    if args.recipe == "gpt":  # a recipe with a tensor-parallel plan
        variants["tensor parallel 2 ranks (tp 2, M=4 accumulated)"] = (
            [*base, "cluster.nproc_per_node=2", "parallel.tp=2", "batch.grad_accum=4", "parallel.pipeline_stages=1"],
            None)
    times: dict[str, list[float]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, (overrides, _)) in enumerate(variants.items()):
                times[name].append(run(tmp, f"r{r}v{i}", overrides, 10))
    one = statistics.median(times["one process (M=4 accumulated)"])
    print(f"{args.recipe}, global batch 32, {args.steps} steps, {args.rounds} interleaved rounds\n")
    print("| variant | step time (median) | spread | vs one process | bubble (P-1)/(M+P-1) | ideal vs one process |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (_, pm) in variants.items():
        t = times[name]
        bubble = f"{(pm[0] - 1) / (pm[1] + pm[0] - 1):.1%}" if pm else "-"
        ideal = f"{pm[0] * pm[1] / (pm[1] + pm[0] - 1):.2f}x faster" if pm else "-"
        print(f"| {name} | {statistics.median(t) * 1000:.1f} ms | {min(t) * 1000:.1f}-{max(t) * 1000:.1f} ms | "
              f"{one / statistics.median(t):.2f}x | {bubble} | {ideal} |")


if __name__ == "__main__":
    main()
