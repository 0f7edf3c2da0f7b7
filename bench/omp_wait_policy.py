"""libgomp's wait policy for a rank whose OpenMP threads share their cores: ``recipe=wide_deep`` on one rank with one
thread per core (``cluster.nproc_per_node=1``), with ``OMP_WAIT_POLICY`` unset (libgomp spins at its barriers) and
``OMP_WAIT_POLICY=PASSIVE`` (its threads sleep), on a quiet machine and with one busy process (a Python loop) on the
machine the whole run. The four alternate within each round.

    .venv/bin/python bench/omp_wait_policy.py [--rounds 2] [--steps 200] [--out bench/results/omp_wait_policy.txt]

Reported: the rank's samples/s (summary.json) per case and round, and the median. Not a test: the figures belong to
the machine (a busy process takes one core of a 2-core machine; on a bigger one it takes a smaller share).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (("unset, quiet", None, False), ("PASSIVE, quiet", "PASSIVE", False),
         ("unset, one busy process", None, True), ("PASSIVE, one busy process", "PASSIVE", True))


def run(policy: str | None, busy: bool, steps: int, logs: Path) -> float:
    """The rank's samples/s of one wide_deep run."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"COLUMNS": "200"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    name = f"run{time.monotonic_ns()}"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        res = subprocess.run([sys.executable, "-m", "launcher.cli", "recipe=wide_deep", f"trainer.steps={steps}",
                              "cluster.nproc_per_node=1", f"output.log_dir={logs}", f"output.run_name={name}"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if res.returncode:
        sys.exit(f"run failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    summary = json.loads((logs / name / "summary.json").read_text())
    shutil.rmtree(logs / name)
    return summary["ranks"][0]["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench/results/omp_wait_policy.txt"))
    args = ap.parse_args()
    got: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    with tempfile.TemporaryDirectory() as logs:
        for r in range(args.rounds):
            for name, policy, busy in (CASES if r % 2 == 0 else CASES[::-1]):
                got[name].append(run(policy, busy, args.steps, Path(logs)))
                print(f"round {r + 1}, {name}: {got[name][-1]:,.0f} samples/s", flush=True)
    lines = [f"bench/omp_wait_policy.py --rounds {args.rounds} --steps {args.steps}",
             f"{platform.node()}: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}; recipe=wide_deep, 1 rank, "
             f"OMP_NUM_THREADS = the cores; samples/s of the rank, median (rounds)", ""]
    for name, values in got.items():
        lines.append(f"{name:<28}{statistics.median(values):>10,.0f}   ({', '.join(f'{v:,.0f}' for v in values)})")
    text = "\n".join(lines) + "\n"
    print("\n" + text, end="")
    Path(args.out).write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
