"""A streamed ``recipe=wide_deep data=tabular`` run over a big Parquet directory, killed mid-epoch and resumed, against
the same run uninterrupted (issue 32's acceptance: "killed mid-epoch and resumed, its per-step losses equal the
uninterrupted run's").

    .venv/bin/python bench/tabular_resume.py [--path /tmp/hl-tabular-stream/rows50000000] [--rows 50000000]
                                             [--steps 400] [--checkpoint 150] [--kill-after 250] [--batch 4096]
                                             [--out bench/results/tabular_resume.txt]

The directory is bench/criteo_parquet.py's (written there first when missing: --rows rows, row groups of 250 k, 10 per
file; bench/tabular_stream.py --keep leaves the same). Three 2-rank runs: (1) uninterrupted, --steps steps; (2) the same
with a checkpoint every --checkpoint steps, whose rank 1 is sent SIGKILL once rank 0 has logged step --kill-after (a
lost process: no clean exit, no last checkpoint); (3) ``trainer.resume=latest`` of (2). Every step is logged. Checked:
the killed run's steps equal (1)'s, the resumed run starts after the last checkpoint and each of its steps' losses equals
(1)'s exactly, on both ranks. Not a test (minutes and gigabytes); the figures belong to the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from criteo_parquet import write_criteo_parquet  # noqa: E402


def losses(run: Path, rank: int) -> dict[int, float]:
    path = run / f"rank.{rank}" / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "event" not in r}


def launch(common: list[str], logs: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "launcher.cli", *common, f"output.log_dir={logs}", f"output.run_name={name}", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})


def finish(proc: subprocess.Popen, want: int) -> str:
    out, _ = proc.communicate()
    if proc.returncode != want:
        sys.exit(f"run exited {proc.returncode}, not {want}:\n{out[-4000:]}")
    return out


def killed_run(common: list[str], logs: Path, name: str, every: int, after: int) -> tuple[int, float]:
    """Run (2): SIGKILL rank 1 once rank 0 logged step ``after``; (its last logged step, seconds it ran)."""
    t0 = time.perf_counter()
    proc = launch(common, logs, name, f"trainer.checkpoint_every={every}")
    run = logs / name
    while proc.poll() is None:
        if max(losses(run, 0), default=0) >= after:
            os.kill(int((run / "rank.1" / "pid").read_text().split()[1]), signal.SIGKILL)
            break
        time.sleep(0.2)
    finish(proc, 1)
    return max(losses(run, 0), default=0), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", type=Path, default=Path("/tmp/hl-tabular-stream/rows50000000"))
    ap.add_argument("--rows", type=int, default=50_000_000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--checkpoint", type=int, default=150)
    ap.add_argument("--kill-after", type=int, default=250)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--buckets", type=int, default=100_000)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not a.path.exists():
        write_criteo_parquet(a.path, a.rows, group=250_000, groups_per_file=10)
    common = ["recipe=wide_deep", "data=tabular", f"data.path={a.path}", "data.label=label", "data.positive=1",
              f"data.hash_buckets={a.buckets}", "trainer.epochs=0", f"trainer.steps={a.steps}",
              f"batch.global_size={a.batch}", "eval.batches=0", "trainer.log_every=1", "cluster.nproc_per_node=2"]
    logs = Path(tempfile.mkdtemp(prefix="tabular_resume_"))
    t0 = time.perf_counter()
    out = finish(launch(common, logs, "straight", "trainer.checkpoint_every=-1"), 0)
    straight_s = time.perf_counter() - t0
    rows = next((" ".join(line.split()) for line in out.splitlines() if "train rows in" in line), "")
    last, killed_s = killed_run(common, logs, "killed", a.checkpoint, a.kill_after)
    t0 = time.perf_counter()
    finish(launch(common, logs, "resumed", "trainer.resume=latest", f"trainer.checkpoint_every={a.checkpoint}"), 0)
    resumed_s = time.perf_counter() - t0
    saved = a.checkpoint * (last // a.checkpoint)
    lines = [f"bench/tabular_resume.py --path {a.path} --steps {a.steps} --checkpoint {a.checkpoint} "
             f"--kill-after {a.kill_after} --batch {a.batch} ({os.cpu_count()} cores, {time.strftime('%Y-%m-%d')})",
             rows,
             f"uninterrupted: {a.steps} steps in {straight_s:.0f} s; killed: rank 1 SIGKILLed after rank 0 logged step "
             f"{last} ({killed_s:.0f} s), last checkpoint step {saved}; resumed from it: {resumed_s:.0f} s"]
    ok = True
    for rank in (0, 1):
        want, before, after = (losses(logs / n, rank) for n in ("straight", "killed", "resumed"))
        same_before = all(before[s] == want[s] for s in before)
        steps_after = sorted(after)
        equal = [after[s] == want[s] for s in steps_after]
        worst = max((abs(after[s] - want[s]) / abs(want[s]) for s in steps_after), default=float("nan"))
        ok &= same_before and all(equal) and steps_after == list(range(saved + 1, a.steps + 1))
        lines.append(f"rank {rank}: killed run's {len(before)} logged steps equal the uninterrupted run's: {same_before}; "
                     f"resumed run logged steps {steps_after[0]}-{steps_after[-1]}, {sum(equal)}/{len(equal)} losses "
                     f"bit-equal to the uninterrupted run's (worst relative difference {worst:.1e})")
    lines.append(f"per-step losses of the resumed run equal the uninterrupted run's: {ok}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text + "\n\n")
    import shutil

    shutil.rmtree(logs, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
