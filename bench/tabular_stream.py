"""Streamed data=tabular: the data path alone (samples/s per rank) and each rank's peak RSS in a 2-rank
``recipe=wide_deep data=tabular`` run, as the Parquet directory grows from 5 M to 50 M rows (the rank's memory should
not grow with it: acceptance within 10 %).

    .venv/bin/python bench/tabular_stream.py [--rows 5000000,50000000] [--dir /tmp/hl-tabular-stream]
                                             [--group 250000] [--groups-per-file 10] [--buckets 100000]
                                             [--batch 4096] [--steps 300] [--data-batches 500] [--rounds 2]
                                             [--eval-batches 10]
                                             [--keep] [--out bench/results/tabular_stream.txt]

The data is bench/criteo_parquet.py's (13 int columns, 26 hex-id columns, a label): the biggest size is written once
under --dir (free disk checked first), each smaller one is a folder of links to its first files (the same rows), and
--dir is deleted at the end unless --keep. Per round and size, interleaved: (1) the data path alone: two fresh
processes at once, as rank 0 and 1 of dp 2, each builds the data source from its config and draws --data-batches
micro-batches of --batch / 2 rows after the first (which reads the statistics sample and the first window); its
samples/s, its peak RSS (VmHWM) and what streaming added to it (the peak less the RSS once the source was built:
compared with the plan's data term); (2) the training run: ``hetero-launch recipe=wide_deep data=tabular ...`` on 2
ranks for --steps steps of global batch --batch (eval capped at --eval-batches batches per rank), each rank's peak RSS
(VmHWM, rank.N/memory.json via summary.json), the plan's predicted peak and the samples/s each rank trains on (the
run's global samples/s / 2); data/train is the data path's samples/s over that. --eval-batches 0 evaluates the whole
held-out set (the default of eval.max_batches), so the peak then counts an evaluation that streams more rows the more
the directory holds. The table gives the median (min-max) over the rounds. Not a test: the figures belong to the
machine.
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
sys.path.insert(0, str(ROOT / "bench"))
from criteo_parquet import write_criteo_parquet  # noqa: E402

BYTES_PER_ROW = 100
"""Parquet bytes per generated row, with margin (78 measured), for the free-disk check."""
CHILD = """
import json, sys, time
import torch
from launcher.recipes.wide_deep.tabular import TabularCTR
torch.set_num_threads(1)  # as a rank of 2 on 2 cores runs (OMP_NUM_THREADS=1)
from launcher.worker.accounting import peak_resident_bytes, resident_bytes
a = json.loads(sys.argv[1])
source = TabularCTR(a["path"], "label", "1", "", [], [], [], 0.2, 100000, [], 0, a["buckets"])
before = resident_bytes()
batches = source.train_batches(a["rank"], 2, a["micro"], 1234)
next(batches)
start, n = time.perf_counter(), 0
for _ in range(a["batches"]):
    (dense, ids), y = next(batches)
    n += len(y)
print(json.dumps({"samples_per_s": n / (time.perf_counter() - start), "rss": peak_resident_bytes(),
                  "stream": peak_resident_bytes() - before}))
"""


def prepare_data(folder: Path, sizes: list[int], group: int, per_file: int) -> dict[int, Path]:
    """size -> a directory of that many rows: the biggest written, smaller ones as links to its first files."""
    biggest = max(sizes)
    need = biggest * BYTES_PER_ROW
    free = shutil.disk_usage(folder.parent if not folder.exists() else folder).free
    if free < need * 1.2:
        sys.exit(f"{folder}: {free / 1e9:.1f} GB free, {need * 1.2 / 1e9:.1f} GB needed for {biggest:,} rows")
    full = folder / f"rows{biggest}"
    if not (full / "_done").exists():
        start = time.perf_counter()
        shutil.rmtree(full, ignore_errors=True)
        write_criteo_parquet(full, biggest, group, per_file, workers=min(2, os.cpu_count() or 1))
        (full / "_done").write_text("")
        print(f"wrote {full} in {time.perf_counter() - start:.0f} s", flush=True)
    files = sorted(full.glob("*.parquet"))
    dirs = {biggest: full}
    for n in sizes:
        if n == biggest:
            continue
        if n % (group * per_file):
            sys.exit(f"--rows {n} is not a multiple of --group × --groups-per-file ({group * per_file:,})")
        dirs[n] = folder / f"rows{n}"
        shutil.rmtree(dirs[n], ignore_errors=True)
        dirs[n].mkdir(parents=True)
        for f in files[: n // (group * per_file)]:
            (dirs[n] / f.name).symlink_to(f)
    return dirs


def data_path(path: Path, args) -> list[dict]:
    """Two data-path processes at once (rank 0 and 1 of dp 2): samples/s and peak RSS of each."""
    procs = []
    for rank in (0, 1):
        a = {"path": str(path), "rank": rank, "micro": args.batch // 2, "buckets": args.buckets,
             "batches": args.data_batches}
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(a)], cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode:
            sys.exit(f"data path failed:\n{stderr[-3000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def train(path: Path, args, logs: Path) -> list[dict]:
    """A 2-rank run; per rank its peak RSS, the plan's predicted peak and the samples/s it trains on (the run's
    global samples/s, which every rank logs, over 2)."""
    name = f"run{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "launcher.cli", "recipe=wide_deep", "data=tabular", f"data.path={path}",
           "data.label=label", "data.positive=1", f"data.hash_buckets={args.buckets}", "trainer.epochs=0",
           f"trainer.steps={args.steps}", f"batch.global_size={args.batch}", f"eval.max_batches={args.eval_batches}",
           "trainer.log_every=50", "cluster.nproc_per_node=2", f"output.log_dir={logs}", f"output.run_name={name}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    if res.returncode:
        sys.exit(f"training run failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    summary = json.loads((logs / name / "summary.json").read_text())
    plan = json.loads((logs / name / "plan.json").read_text())
    data_term = next((t["bytes"] for t in plan["peak"]["terms"] if t["name"] == "data"), None)
    shutil.rmtree(logs / name)
    return [{"rss": r["peak_bytes"], "planned": r["planned_peak_bytes"], "samples_per_s": r["samples_per_s"] / 2,
             "data_term": data_term, "auc": summary.get("eval", {}).get("auc")} for r in summary["ranks"]]


def _spread(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


def report(results: dict, args) -> str:
    gib = 2**30
    lines = [f"bench/tabular_stream.py --rows {args.rows} --group {args.group} --groups-per-file "
             f"{args.groups_per_file} --buckets {args.buckets} --batch {args.batch} --steps {args.steps} "
             f"--data-batches {args.data_batches} --rounds {args.rounds} --eval-batches {args.eval_batches}",
             f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
             f"{time.strftime('%Y-%m-%d')}; median (min-max) over {args.rounds} interleaved round(s); 2 ranks "
             f"(dp 2), micro-batch {args.batch // 2} rows; 1-minute load average {args.load[0]:.1f} at the start, "
             f"{os.getloadavg()[0]:.1f} at the end (other work shares this machine: throughput spreads are wide)", "",
             f"{'rows':>11} | {'rank':4} | {'data path samples/s':>25} | {'data path RSS GiB':>19} | "
             f"{'train samples/s/rank':>23} | {'train peak RSS GiB':>19} | planned GiB | data/train",
             "-" * 150]
    for n, per_rank in results.items():
        for rank, r in enumerate(per_rank):
            ratio = statistics.median(r["data_sps"]) / statistics.median(r["train_sps"])
            lines.append(f"{n:>11,} | {rank:4} | {_spread(r['data_sps'], ',.0f'):>25} | "
                         f"{_spread([x / gib for x in r['data_rss']], '.2f'):>19} | "
                         f"{_spread(r['train_sps'], ',.0f'):>23} | {_spread([x / gib for x in r['rss']], '.2f'):>19} | "
                         f"{statistics.median(r['planned']) / gib:11.2f} | {ratio:.1f}x")
    small, big = min(results), max(results)
    for rank in range(2):
        a, b = (statistics.median(results[n][rank]["rss"]) for n in (small, big))
        verdict = "within 10 %" if abs(b / a - 1) <= 0.10 else "NOT within 10 %"
        lines.append(f"rank {rank}: peak RSS at {big:,} rows / at {small:,} rows = {b / a:.3f} ({verdict})")
    for n in results:
        term = results[n][0]["data_term"][-1]
        stream = statistics.median(results[n][0]["stream"] + results[n][1]["stream"])
        lines.append(f"{n:,} rows: the plan's data term (a rank's stream buffers) {term / gib:.2f} GiB; measured in "
                     f"the data path (peak RSS - RSS once the source is built, median of both ranks) "
                     f"{stream / gib:.2f} GiB")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="5000000,50000000")
    ap.add_argument("--dir", default="/tmp/hl-tabular-stream")
    ap.add_argument("--group", type=int, default=250_000)
    ap.add_argument("--groups-per-file", type=int, default=10)
    ap.add_argument("--buckets", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=4096, help="global batch (2 ranks)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--data-batches", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eval-batches", type=int, default=10, help="eval.max_batches (0: the whole held-out set)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--out", default=str(ROOT / "bench/results/tabular_stream.txt"))
    args = ap.parse_args()
    args.load = os.getloadavg()
    sizes = sorted(int(x) for x in args.rows.split(","))
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        dirs = prepare_data(folder, sizes, args.group, args.groups_per_file)
        results = {n: [{k: [] for k in ("data_sps", "data_rss", "stream", "train_sps", "rss", "planned", "data_term")}
                       for _ in range(2)] for n in sizes}
        with tempfile.TemporaryDirectory(dir=folder) as logs:
            for r in range(args.rounds):
                for n in sizes:
                    for rank, m in enumerate(data_path(dirs[n], args)):
                        results[n][rank]["data_sps"].append(m["samples_per_s"])
                        results[n][rank]["data_rss"].append(m["rss"])
                        results[n][rank]["stream"].append(m["stream"])
                    for rank, m in enumerate(train(dirs[n], args, Path(logs))):
                        for k, key in (("train_sps", "samples_per_s"), ("rss", "rss"), ("planned", "planned"),
                                       ("data_term", "data_term")):
                            results[n][rank][k].append(m[key])
                    last = results[n][0]
                    print(f"round {r + 1}, {n:,} rows: data path {last['data_sps'][-1]:,.0f} samples/s, train "
                          f"{last['train_sps'][-1]:,.0f} samples/s, rank 0 peak RSS {last['rss'][-1] / 2**30:.2f} "
                          f"GiB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    text = report(results, args)
    print("\n" + text, end="")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
