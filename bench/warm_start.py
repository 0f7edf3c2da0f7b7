"""Warm rank start against fresh interpreters: the same short runs, interleaved in one invocation.

    .venv/bin/python bench/warm_start.py [--rounds 5] [--steps 4]

Each round runs every case twice, once with the default (launcher.warm_start=true: ranks forked from a forkserver
that imported torch, torch._dynamo and the worker once) and once with launcher.warm_start=false (each rank a fresh
``python -m launcher.worker``), alternating which goes first. Per run: the wall time of the whole command, and the
machine's CPU time over it (user + system of every core, /proc/stat: the launcher, the forkserver and every rank; a
forkserver's ranks are no children this process could count with getrusage). Run it on a quiet machine. Prints
medians, spreads (min-max) and ratios, and writes bench/results/warm_start.json. Not a test: the figures depend on
the machine.
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

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "quickstart, 2 ranks": ["recipe=quickstart"],
    "wide_deep, 2 ranks": ["recipe=wide_deep"],
    "gpt, 4 ranks": ["recipe=gpt", "cluster.nproc_per_node=4"],
}


def one_run(overrides: list[str], warm: bool, steps: int, workdir: Path) -> dict:
    before = machine_cpu_s()
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "launcher.cli", *overrides, f"trainer.steps={steps}",
                          "trainer.checkpoint_every=-1", f"launcher.warm_start={str(warm).lower()}"],
                         cwd=workdir, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - t0
    cpu = machine_cpu_s() - before
    if res.returncode != 0:
        raise RuntimeError(f"{overrides} warm={warm} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": cpu}


def machine_cpu_s() -> float:
    """Seconds of CPU every core has spent in user and system mode since boot (/proc/stat's first line)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system = (int(x) for x in fields[:3])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    runs: dict[str, dict[str, list[dict]]] = {c: {"warm": [], "cold": []} for c in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for case, overrides in CASES.items():
                order = (True, False) if r % 2 == 0 else (False, True)
                for warm in order:
                    runs[case]["warm" if warm else "cold"].append(one_run(overrides, warm, args.steps, Path(tmp)))
    out = {"rounds": args.rounds, "steps": args.steps, "cpus": os.cpu_count(), "cases": {}}
    print(f"| case | warm wall s | fresh wall s | wall ratio | warm CPU s | fresh CPU s | CPU ratio |  ({args.rounds} "
          f"rounds, median [min-max])")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        row = {k: {m: summary([x[m] for x in runs[case][k]]) for m in ("wall_s", "cpu_s")} for k in ("warm", "cold")}
        out["cases"][case] = row
        w, c = row["warm"], row["cold"]

        def cell(s):
            return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

        print(f"| {case} | {cell(w['wall_s'])} | {cell(c['wall_s'])} | "
              f"{w['wall_s']['median'] / c['wall_s']['median']:.2f} | {cell(w['cpu_s'])} | {cell(c['cpu_s'])} | "
              f"{w['cpu_s']['median'] / c['cpu_s']['median']:.2f} |")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "warm_start.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
