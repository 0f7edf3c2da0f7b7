"""data=tabular with data.hash_buckets: peak RSS of the launcher's fact pass and of a rank's tensor pass as the number
of distinct values of a categorical column grows and the rows stay the same, hashed and with vocabularies.

    .venv/bin/python bench/tabular_hash.py [--rows 10000000] [--distinct 10000,1000000,10000000] [--buckets 1000000]
                                           [--repeats 3] [--dir /tmp/hl-tabular-hash] [--keep]
                                           [--out bench/results/tabular_hash.txt]

Each file (CSV, written once per run under --dir and deleted at the end unless --keep) has --rows rows: clicked
(0/1, 25% positive), I1 (an int), I2 (a float, 5% missing), I3 (a float) and C1, a random 64-bit value as 16 hex
digits (as Criteo's categories are 32-bit ones as 8), each of the --distinct values on rows/distinct rows, shuffled.
Every measurement is a fresh process that imports the recipe and calls ``prepare(path, "clicked", "1", ...)``:
``tensors=False`` is what the launcher does before planning (the facts), ``tensors=True`` what every rank does (its
tensors); "hashed" passes hash_buckets=--buckets, "vocab" leaves max_vocab at its default (100,000: a column with
more distinct values is hashed into that many buckets after its whole dictionary is built). Its peak RSS is
ru_maxrss of os.wait4 on it (VmHWM); "import only" is the same process without the prepare call (torch, numpy,
pyarrow). The variants are interleaved (every file, mode and pass once per round) and each is run --repeats times;
the table shows the median and the min-max. Not a test: the figures belong to the machine.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time
from launcher.recipes.wide_deep.tabular import prepare
kwargs = json.loads(sys.argv[1])
start = time.perf_counter()
p = None if kwargs is None else prepare(**kwargs)
print(json.dumps({"s": time.perf_counter() - start, "resident": p.resident_bytes() if p else 0,
                  "fields": p.field_sizes if p else [], "rows": p.train_rows + p.test_rows if p else 0}))
"""


def write_csv(path: Path, rows: int, distinct: int, seed: int = 0) -> None:
    """The file described above, written a million rows at a time by pyarrow."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    values = rng.integers(0, np.iinfo(np.uint64).max, size=distinct, dtype=np.uint64, endpoint=True)
    which = np.arange(rows, dtype=np.int64) % distinct  # every value on rows/distinct rows
    rng.shuffle(which)
    hexes = np.array([f"{i:02x}".encode() for i in range(256)], "S2").view(np.uint16)
    schema = pa.schema([("clicked", pa.int8()), ("I1", pa.int32()), ("I2", pa.float64()), ("I3", pa.float64()),
                        ("C1", pa.string())])
    options = pcsv.WriteOptions(quoting_style="none")
    with pcsv.CSVWriter(path, schema, write_options=options) as out:
        for start in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - start)
            digits = hexes[values[which[start:start + n]].astype(">u8").view(np.uint8).reshape(n, 8)]
            c1 = pa.array(np.ascontiguousarray(digits).view("S16").reshape(n)).cast(pa.string())
            i2 = np.round(rng.gamma(2.0, 3.0, n), 2)
            out.write_batch(pa.record_batch([
                pa.array((rng.random(n) < 0.25).astype(np.int8)), pa.array(rng.integers(0, 1000, n, dtype=np.int32)),
                pa.array(i2, mask=rng.random(n) < 0.05), pa.array(np.round(rng.normal(0, 1, n), 3)), c1], schema))


def measure(kwargs: dict | None) -> dict:
    """A fresh process runs prepare(**kwargs) (None: imports only): its figures and peak RSS in bytes."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(kwargs)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err)
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"prepare({kwargs}) failed:\n{err.read().decode(errors='replace')[-3000:]}")
    return {**json.loads(out), "rss": usage.ru_maxrss * 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--distinct", default="10000,1000000,10000000")
    ap.add_argument("--buckets", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/hl-tabular-hash")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--out", default=str(ROOT / "bench/results/tabular_hash.txt"))
    args = ap.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    try:
        for d in [int(x) for x in args.distinct.split(",")]:
            files[d] = folder / f"rows{args.rows}-distinct{d}.csv"
            if not files[d].exists():
                start = time.perf_counter()
                write_csv(files[d], args.rows, d)
                size = files[d].stat().st_size / 1e6
                print(f"wrote {files[d]} ({size:.0f} MB) in {time.perf_counter() - start:.0f} s", flush=True)
        sizes = {d: path.stat().st_size / 1e6 for d, path in files.items()}
        results = run(files, args)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    report(results, sizes, args)


def run(files: dict, args) -> dict:
    modes = {"hashed": {"hash_buckets": args.buckets}, "vocab": {}}
    results: dict = {("import only", "-", "-"): []}
    for r in range(args.repeats):
        results["import only", "-", "-"].append(measure(None))
        for d, path in files.items():
            for mode, extra in modes.items():
                for tensors in (False, True):
                    kwargs = {"path": str(path), "label": "clicked", "positive": "1", "tensors": tensors, **extra}
                    m = measure(kwargs)
                    results.setdefault((d, mode, "rank (tensors)" if tensors else "launcher (facts)"), []).append(m)
                    print(f"round {r + 1}: {d:>10,} distinct, {mode:6}, {'rank' if tensors else 'launcher'}: "
                          f"{m['rss'] / 2**30:.2f} GiB peak RSS, {m['s']:.1f} s", flush=True)
    return results


def _spread(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


def report(results: dict, sizes: dict, args) -> None:
    lines = [f"bench/tabular_hash.py --rows {args.rows} --distinct {args.distinct} --buckets {args.buckets} "
             f"--repeats {args.repeats}",
             f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, "
             f"{time.strftime('%Y-%m-%d')}; each row: median (min-max) of {args.repeats} fresh processes",
             f"files: {args.rows:,} rows each; " + ", ".join(f"{d:,} distinct C1 {s:.0f} MB" for d, s in sizes.items()),
             "",
             f"{'distinct C1':>12} | {'mode':6} | {'pass':16} | {'peak RSS GiB':>19} | {'prepare s':>17} | rank keeps",
             "-" * 100]
    for (d, mode, what), ms in results.items():
        rss = _spread([m["rss"] / 2**30 for m in ms], ".2f")
        secs = _spread([m["s"] for m in ms], ".1f") if d != "import only" else "-"
        keeps = f"{ms[0]['resident'] / 2**30:.2f} GiB" if "rank" in what else ""
        lines.append(f"{d if isinstance(d, str) else format(d, ','):>12} | {mode:6} | {what:16} | {rss:>19} | "
                     f"{secs:>17} | {keeps}")
    text = "\n".join(lines) + "\n"
    print("\n" + text, end="")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
