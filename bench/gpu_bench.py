"""One GPU: where tables and the optimizer live, and which data-parallel part runs an intent, by step time.

    python bench/gpu_bench.py [--rounds 3] [--steps 40]      (on a host with a CUDA device)

Every variant is the same job through hetero-launch on one rank on cuda:0 (cluster.device=cuda), run interleaved
(a, b, c, ..., a, b, c, ...):
  wide_deep, 26 tables of --rows rows (dim 16), global batch 8192:
    device tables       the tables on the GPU with their sparse optimizers (lazy Adam, FTRL)
    host tables         placement.host_device_mix=1: tables and their optimizers on the host, rows through pinned memory
    host tables, prefetch 2   ... with placement.prefetch=2: the next micro-batches' rows gathered on a side stream
                        while this one steps (issue 32: host tables <= 1.2x device tables; never run on a GPU yet)
    host tables + CPU   ... and optimizer.target=CPU: the dense part's Adam on the host too
  gpt, width --width, --layers blocks, 8 heads, 256-token sequences, global batch 32:
    fp32                no data-parallel wrapper (one rank)
    optimizer on CPU    optimizer.target=CPU as DeepSpeed ZeRO-Offload (its CPU Adam) | as FSDP2 + CPUOffloadPolicy
    bf16                precision=bf16 as DeepSpeed's bf16 | as FSDP2's MixedPrecisionPolicy
Step time = the median over 10-step windows after the first 10 steps (metrics.jsonl's wall_s); the table gives the
median over rounds, the spread (min-max over rounds) and the ratio to the first row of its group. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline_bench import step_time  # bench/ is on sys.path when this file runs

GPU = ["cluster.device=cuda", "cluster.backend=nccl", "cluster.nproc_per_node=1"]


def variants(a: argparse.Namespace) -> dict[str, dict[str, list[str]]]:
    wd = ["recipe=wide_deep", f"model.rows_per_table={a.rows}", "batch.global_size=8192"]
    gpt = ["recipe=gpt", f"model.width={a.width}", f"model.layers={a.layers}", "model.heads=8", "model.seq_len=256",
           "model.vocab_size=256", "batch.global_size=32"]
    return {
        "wide_deep": {"device tables": wd, "host tables": [*wd, "placement.host_device_mix=1"],
                      "host tables, prefetch 2": [*wd, "placement.host_device_mix=1", "placement.prefetch=2"],
                      "host tables + optimizer on CPU": [*wd, "placement.host_device_mix=1", "optimizer.target=CPU"]},
        "gpt": {"fp32": gpt,
                "optimizer on CPU, deepspeed": [*gpt, "optimizer.target=CPU", "parallel.data_parallel=deepspeed"],
                "optimizer on CPU, fsdp": [*gpt, "optimizer.target=CPU", "parallel.data_parallel=fsdp"],
                "bf16, deepspeed": [*gpt, "precision=bf16", "parallel.data_parallel=deepspeed"],
                "bf16, fsdp": [*gpt, "precision=bf16", "parallel.data_parallel=fsdp"]},
    }


def run(cwd: str, name: str, overrides: list[str], steps: int, window: int = 10) -> float:
    cmd = [sys.executable, "-m", "launcher.cli", *overrides, *GPU, f"trainer.steps={steps}",
           f"output.run_name={name}", "trainer.checkpoint_every=-1", "eval.batches=0", f"trainer.log_every={window}"]
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return step_time(Path(cwd) / "log_output" / name, window)


def table(groups: dict[str, dict[str, list[str]]], times: dict[str, list[float]]) -> None:
    print("| job | variant | step time [spread] | ratio to the group's first |")
    print("|---|---|---:|---:|")
    for group, vs in groups.items():
        first = statistics.median(times[next(iter(vs))])
        for v in vs:
            t = times[v]
            print(f"| {group} | {v} | {statistics.median(t) * 1000:.1f} ms [{min(t) * 1000:.1f}-{max(t) * 1000:.1f}] "
                  f"| {statistics.median(t) / first:.2f}x |")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rows", type=int, default=200_000, help="rows per wide_deep table")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    groups = variants(a)
    times: dict[str, list[float]] = {v: [] for vs in groups.values() for v in vs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for i, (group, vs) in enumerate(groups.items()):
                for j, (v, overrides) in enumerate(vs.items()):
                    times[v].append(run(tmp, f"r{r}g{i}v{j}", overrides, a.steps))
            print(f"after round {r + 1} of {a.rounds}:")
            table(groups, times)


if __name__ == "__main__":
    main()
