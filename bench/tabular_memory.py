"""data=tabular on a big CSV: the launcher's peak RSS and wall time for a dry run, and each rank's peak RSS for a
short real run (2 ranks), on the code before the column-wise reader (issue 21, items 10 and 12) and after.

    .venv/bin/python bench/tabular_memory.py [--rows 4800000] [--csv /tmp/hl-tabular/ctr.csv] [--old 34fb0cd]
                                              [--new .] [--steps 5] [--skip-run] [--keep-ids] [--pythonpath DIR]

The file is tests/data/make_ctr_csv.py's (user_id, age, hours, job, city, device, clicked; 4.8 M rows = 199 MB),
written once to --csv when missing, and read with data.drop=[user_id] (--keep-ids: data.drop=[], so user_id is a
categorical field of 4.8 M distinct values, hashed). "old" is commit 34fb0cd (the file read into Python strings per
cell, in the launcher and again in every rank); "new" is this checkout as it is (".", or a revision). Each tree
runs from a detached git worktree at /tmp/hl-old-<sha> (created when missing) through a package dir mapped as the
editable install maps this checkout, first on PYTHONPATH (--pythonpath DIR goes after it: e.g. a folder holding
pyarrow, `pip install --no-index --target DIR pyarrow-*.whl`, to measure the pyarrow reader).

Dry run: `hetero-launch ... dry_run=true`; the launcher's peak RSS is ru_maxrss of os.wait4 on it (it starts no
child of its own in a dry run). Real run: trainer.steps=--steps on 2 ranks, no eval, no checkpoint; every process
under the launcher is polled every 50 ms and each rank's peak is its last VmHWM (/proc/PID/status), the launcher's
its own VmHWM. Not a test: the figures belong to the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import package_dir, source_tree  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ["recipe=wide_deep", "data=tabular", "data.label=clicked", "data.positive=yes"]


def _hwm(pid: int) -> int:
    """VmHWM of pid in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def dry_run(pythonpath: Path, cwd: Path, csv: Path, drop: str) -> tuple[float, int]:
    """(wall s, the launcher's peak RSS in bytes)."""
    cmd = [sys.executable, "-m", "launcher.cli", *DATA, f"data.drop={drop}", f"data.path={csv}", "dry_run=true"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": str(pythonpath)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.decode()[-3000:]}")
    return wall, usage.ru_maxrss * 1024


def real_run(pythonpath: Path, cwd: Path, csv: Path, drop: str, steps: int) -> tuple[float, int, list[int]]:
    """(wall s, the launcher's peak RSS, each rank's peak RSS) in bytes."""
    cmd = [sys.executable, "-m", "launcher.cli", *DATA, f"data.drop={drop}", f"data.path={csv}",
           "cluster.nproc_per_node=2", "trainer.epochs=0", f"trainer.steps={steps}", "eval.batches=0",
           "trainer.checkpoint_every=-1"]
    start = time.perf_counter()
    log = open(cwd / "real_run.log", "wb")
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": str(pythonpath)}, stdout=log,
                            stderr=subprocess.STDOUT)
    peaks: dict[int, tuple[str, int]] = {}
    launcher_peak = 0
    while proc.poll() is None:
        launcher_peak = max(launcher_peak, _hwm(proc.pid))
        for pid in _descendants(proc.pid):
            name = peaks.get(pid, (None, 0))[0] or _cmdline(pid)
            peaks[pid] = (name, max(peaks.get(pid, ("", 0))[1], _hwm(pid)))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{(cwd / 'real_run.log').read_text()[-3000:]}")
    ranks = [peak for name, peak in peaks.values() if "launcher.worker" in name]
    return wall, launcher_peak, sorted(ranks, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_800_000)
    ap.add_argument("--csv", default="/tmp/hl-tabular/ctr.csv")
    ap.add_argument("--old", default="34fb0cd", help="a revision, or 'none' to measure --new only")
    ap.add_argument("--new", default=".")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip-run", action="store_true", help="the dry runs only")
    ap.add_argument("--keep-ids", action="store_true",
                    help="keep user_id (4.8 M distinct values, hashed into data.max_vocab buckets): data.drop=[]")
    ap.add_argument("--pythonpath", default="", help="appended to each tree's PYTHONPATH (e.g. a folder with pyarrow)")
    args = ap.parse_args()
    csv = Path(args.csv)
    if not csv.exists():
        sys.path.insert(0, str(ROOT))
        from tests.data.make_ctr_csv import write_ctr_csv

        csv.parent.mkdir(parents=True, exist_ok=True)
        write_ctr_csv(str(csv), args.rows)
    size = csv.stat().st_size
    gib = lambda b: f"{b / 2**30:.2f} GiB ({b / size:.1f}x the file)"  # noqa: E731
    trees = [(t, rev) for t, rev in (("old", args.old), ("new", args.new)) if rev != "none"]
    drop = "[]" if args.keep_ids else "[user_id]"
    print(f"{csv}: {size / 1e6:.0f} MB; recipe=wide_deep data=tabular data.drop={drop}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for t, rev in trees:
            path = package_dir(source_tree(rev), Path(tmp) / t)
            pythonpath = f"{path}{os.pathsep}{args.pythonpath}" if args.pythonpath else str(path)
            work = Path(tmp) / f"{t}-cwd"
            work.mkdir()
            wall, peak = dry_run(pythonpath, work, csv, drop)
            print(f"{t} ({rev}): dry run {wall:.1f} s, launcher peak RSS {gib(peak)}", flush=True)
            if not args.skip_run:
                wall, launcher, ranks = real_run(pythonpath, work, csv, drop, args.steps)
                print(f"{t} ({rev}): {args.steps}-step run on 2 ranks {wall:.1f} s, launcher peak RSS {gib(launcher)}, "
                      f"rank peak RSS {', '.join(gib(r) for r in ranks)}", flush=True)


if __name__ == "__main__":
    main()
