"""DataLoader workers against the training thread, end to end through hetero-launch: a map-style Dataset that takes
``delay`` seconds per item (tests/usercode/loader_project.py's Slow: a decode, a tokenizer, a remote read) trains with
loader.num_workers=0 and =W, interleaved in pairs; medians of samples/s (summary.json), their ratio and spread, and
whether the two read the same samples (per-step losses equal). samples/s: steps WARM..last over their wall time
(metrics.jsonl's wall_s), so the read-ahead the workers fill before the first steps does not count.

    .venv/bin/python bench/loader_workers.py [--pairs 3] [--steps 40] [--delay 0.002] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WARM = 10
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.usercode.loader_project import write_project  # noqa: E402


def run(project: Path, name: str, workers: int, args: argparse.Namespace) -> tuple[float, list[float]]:
    cmd = [sys.executable, "-m", "launcher.cli", "--config-dir", "conf", "recipe=slow", f"+data.delay={args.delay}",
           f"trainer.steps={args.steps}", "trainer.log_every=1", "trainer.checkpoint_every=-1", "eval.max_batches=1",
           f"cluster.nproc_per_node={args.ranks}", f"loader.num_workers={workers}", f"output.run_name={name}"]
    res = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(res.stdout[-2000:] + res.stderr[-2000:])
    run_dir = project / "log_output" / name
    records = [r for r in map(json.loads, (run_dir / "rank.0" / "metrics.jsonl").read_text().splitlines())
               if "event" not in r]
    warm = records[WARM - 1]  # steady state: from step WARM to the last (the workers' first read-ahead excluded)
    rate = (records[-1]["step"] - warm["step"]) * 16 / (records[-1]["wall_s"] - warm["wall_s"])
    return rate, [r["loss"] for r in records]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.002)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ranks", type=int, default=1)
    args = p.parse_args()
    project = write_project(Path(tempfile.mkdtemp(prefix="loader_bench_")))
    rates: dict[int, list[float]] = {0: [], args.workers: []}
    losses: dict[int, list[float]] = {}
    for i in range(args.pairs):
        for w in (0, args.workers):
            rate, got = run(project, f"w{w}_{i}", w, args)
            rates[w].append(rate)
            losses.setdefault(w, got)
            print(f"pair {i}: num_workers={w}: {rate:.0f} samples/s", flush=True)
    base, fast = statistics.median(rates[0]), statistics.median(rates[args.workers])
    spread = {w: (max(r) - min(r)) / statistics.median(r) for w, r in rates.items()}
    print(f"\n{args.ranks} rank(s), {args.delay * 1e3:g} ms an item, batch.global_size 16, {args.steps} steps, "
          f"{args.pairs} interleaved pairs")
    for w, r in rates.items():
        print(f"num_workers={w}: median {statistics.median(r):.0f} samples/s (runs {', '.join(f'{x:.0f}' for x in r)};"
              f" spread {spread[w]:.0%})")
    print(f"ratio workers/none: {fast / base:.2f}x; per-step losses equal: {losses[0] == losses[args.workers]}")


if __name__ == "__main__":
    main()
