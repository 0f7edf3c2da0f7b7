"""Offloaded dense optimizer step (issue 3, P3): DeepSpeedCPUAdam vs torch.optim.Adam on the host, side by side.

    .venv/bin/python bench/optimizer_bench.py [--sizes 32 96] [--reps 15]

With optimizer.target=CPU DeepSpeed steps the optimizer on its fp32 partition in host memory. It accepts a torch
optimizer there when zero_force_ds_cpu_optimizer is false, which is what hetero-launch emits by default
(optimizer.cpu_impl=torch, fused Adam); optimizer.cpu_impl=deepspeed picks DeepSpeedCPUAdam instead. This measures
one Adam step over N million fp32 parameters (one flat tensor, as DeepSpeed's partition), interleaved, median of
reps. The first run JIT-builds DeepSpeed's cpu_adam op (about a minute) into hetero-launch's op cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from launcher.facts.host import extensions_dir  # noqa: E402

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def make(kind: str, n: int):
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    if kind == "DeepSpeedCPUAdam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam([p], lr=1e-3)
    if kind == "torch Adam fused":
        return torch.optim.Adam([p], lr=1e-3, fused=True)
    return torch.optim.Adam([p], lr=1e-3, foreach=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 96], help="millions of parameters")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    kinds = ["torch Adam fused", "DeepSpeedCPUAdam", "torch Adam foreach"]
    result = {}
    for m in a.sizes:
        opts = {k: make(k, m * 1_000_000) for k in kinds}
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for rep in range(a.reps + 2):
            for k, opt in opts.items():
                t0 = time.perf_counter()
                opt.step()
                if rep >= 2:
                    times[k].append((time.perf_counter() - t0) * 1000)
        result[m] = {k: statistics.median(v) for k, v in times.items()}
        del opts
    print(f"\nAdam step on the host, {torch.get_num_threads()} threads, median of {a.reps} interleaved steps\n")
    print("| params | " + " | ".join(f"{k} (ms)" for k in kinds) + " | DeepSpeedCPUAdam / torch fused |")
    print("|---:|" + "---:|" * (len(kinds) + 1))
    for m, r in result.items():
        print(f"| {m} M | " + " | ".join(f"{r[k]:.1f}" for k in kinds)
              + f" | {r['DeepSpeedCPUAdam'] / r['torch Adam fused']:.2f}x |")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "optimizer.json").write_text(json.dumps({"args": vars(a), "ms": result}, indent=2))


if __name__ == "__main__":
    main()
