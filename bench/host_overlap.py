"""Host-table lookups overlapped with the dense step (placement.prefetch), end to end through hetero-launch: wide_deep
with both tables on the host (placement.host_device_mix=1) at 4.0 M rows per table (model.rows_per_table=153847: 26
fields x 153,847 rows; deep_embedding 4.0 M x 16 with lazy Adam, wide_embedding 4.0 M x 1 with FTRL), the recipe's
global batch 2048, on CPU ranks; placement.prefetch=0 (serial) and =1 interleaved in pairs, the order flipped every
pair, for each rank count. samples/s: steps WARM..last over their wall time (metrics.jsonl's wall_s, rank 0: the
ranks step together), so building the 4 M-row tables and the first steps do not count. Medians, their ratio, each
pair's ratio, the spread of each side ((max - min) / median), the machine's load average at each run's start, and
whether the logged losses (every 10th step, the mean over ranks) are equal.

The runs get OMP_WAIT_POLICY=PASSIVE (both sides alike; --wait-policy '' leaves libgomp's default): with its default
spinning, a 1-rank serial run (OMP_NUM_THREADS 2) fell to 3.5-5.9 k samples/s whenever another process had a core
(the team's spinning thread and the work took turns), while the prefetch run, whose second thread makes libgomp spin
less, held 32-41 k: a 7-10x "gain" that was libgomp's, not the overlap's.

    .venv/bin/python bench/host_overlap.py [--ranks 2 1] [--pairs 3] [--steps 150] [--out bench/results/host_overlap.txt]
    .venv/bin/python bench/host_overlap.py --in-process     (one process, 1 thread: where the time goes, per step)
    .venv/bin/python bench/host_overlap.py --bound          (the most any overlap can give on this machine)

--in-process runs the recipe's WideDeep, its data and the store in this process (no launcher, no DDP), 1 intra-op
thread, serial and prefetch interleaved, and prints per step the wall time and the training thread's own CPU time
(time.thread_time): what prefetch takes off the training thread, which pays only where another core (or a GPU) does
that work meanwhile. On this 2-core machine that core is shared with the other engineers' jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARM = 20
BATCH = 2048


def run(cwd: Path, name: str, ranks: int, prefetch: int, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "launcher.cli", "recipe=wide_deep", "placement.host_device_mix=1",
           f"model.rows_per_table={a.rows_per_table}", f"cluster.nproc_per_node={ranks}",
           f"placement.prefetch={prefetch}", f"trainer.steps={a.steps}", "trainer.log_every=10",
           "trainer.checkpoint_every=-1", "eval.batches=0", f"output.run_name={name}"]
    load = os.getloadavg()[0]
    env = {**os.environ, "COLUMNS": "200", **({"OMP_WAIT_POLICY": a.wait_policy} if a.wait_policy else {})}
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(res.stdout[-3000:] + res.stderr[-3000:])
    records = [json.loads(line) for line in (cwd / "log_output" / name / "rank.0" / "metrics.jsonl").read_text()
               .splitlines()]
    steps = [r for r in records if "event" not in r]
    warm = next(r for r in steps if r["step"] >= WARM)
    rate = (steps[-1]["step"] - warm["step"]) * BATCH / (steps[-1]["wall_s"] - warm["wall_s"])
    stats = next((r for r in records if r.get("event") == "prefetch"), {})
    return {"rate": rate, "losses": [r["loss"] for r in steps], "load": load,
            "stats": {k: stats[k] for k in ("served", "missed", "urgent_rows", "deferred_rows") if k in stats}}


def compare(ranks: int, a: argparse.Namespace, cwd: Path, say) -> None:
    runs: dict[int, list[dict]] = {0: [], 1: []}
    for pair in range(a.pairs):
        for prefetch in ((0, 1) if pair % 2 == 0 else (1, 0)):
            r = run(cwd, f"r{ranks}_p{prefetch}_{pair}", ranks, prefetch, a)
            runs[prefetch].append(r)
            say(f"{ranks} rank(s), pair {pair}: prefetch={prefetch}: {r['rate']:,.0f} samples/s "
                f"(load average {r['load']:.1f} at its start){'  ' + str(r['stats']) if r['stats'] else ''}")
    rates = {p: [r["rate"] for r in rs] for p, rs in runs.items()}
    med = {p: statistics.median(v) for p, v in rates.items()}
    spread = {p: (max(v) - min(v)) / med[p] for p, v in rates.items()}
    pairs = [b / s for s, b in zip(rates[0], rates[1])]
    same = all(r["losses"] == runs[0][0]["losses"] for rs in runs.values() for r in rs)
    say(f"\n{ranks} rank(s) (OMP_NUM_THREADS {max(1, (os.cpu_count() or 1) // ranks)} each, as the plan gives; "
        f"OMP_WAIT_POLICY {a.wait_policy or 'default'}), "
        f"{a.rows_per_table * 26:,} rows per table, global batch {BATCH}, steps {WARM}-{a.steps} timed, "
        f"{a.pairs} interleaved pairs")
    for p in (0, 1):
        say(f"  prefetch={p}: median {med[p]:,.0f} samples/s (runs {', '.join(f'{x:,.0f}' for x in rates[p])}; "
            f"spread {spread[p]:.0%})")
    say(f"  prefetch / serial: {med[1] / med[0]:.2f}x (pairs {', '.join(f'{x:.2f}' for x in pairs)}); "
        f"logged losses equal in every run: {same}\n")


def in_process(a: argparse.Namespace, say) -> None:
    """Serial and prefetch in this process, 1 thread, interleaved: per-step wall and training-thread CPU."""
    import torch

    torch.set_num_threads(1)
    rounds: dict[int, list[tuple[float, float, float]]] = {0: [], 1: []}
    for pair in range(a.pairs):
        for depth in ((0, 1) if pair % 2 == 0 else (1, 0)):
            rounds[depth].append(_steps_in_process(depth, a))
    say(f"in one process, 1 intra-op thread, {a.rows_per_table * 26:,} rows per table, batch {BATCH}, "
        f"{a.pairs} interleaved pairs (medians of per-step medians):")
    for depth, got in rounds.items():
        wall, cpu, loss = (statistics.median(x[i] for x in got) for i in range(3))
        say(f"  prefetch={depth}: {wall:.1f} ms a step, of which the training thread's own CPU {cpu:.1f} ms "
            f"(last loss {loss:.6f})")


def _build(depth: int, a: argparse.Namespace):
    """The recipe's WideDeep, its synthetic data and the store in this process; a Lookahead when ``depth``."""
    import torch

    sys.path.insert(0, str(ROOT))
    from bench.ps_bench import table_plans
    from launcher.recipes.wide_deep.data import SyntheticCTR
    from launcher.recipes.wide_deep.model import WideDeep
    from launcher.tables import build_tables
    from launcher.tables.record import Lookahead

    torch.manual_seed(1234)
    model = WideDeep(13, 26, a.rows_per_table, 16, [256, 128])
    store = build_tables([model], table_plans(a.rows_per_table, 1), torch.device("cpu"), torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = SyntheticCTR(13, 26, a.rows_per_table, 0).train_batches(0, 1, BATCH, 1234)
    ahead = Lookahead(store, depth, torch.device("cpu"), torch.float32) if depth and store.start_prefetch() else None
    return model, store, opt, torch.nn.BCEWithLogitsLoss(), batches, ahead


def _steps_in_process(depth: int, a: argparse.Namespace) -> tuple[float, float, float]:
    import time

    model, store, opt, loss_fn, batches, ahead = _build(depth, a)
    walls, cpus = [], []
    for step in range(60):
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = next(batches) if ahead is None else ahead.take(lambda: next(batches), lambda b: model(*b[0]))[0]
        loss = loss_fn(model(*batch[0]), batch[1])
        opt.zero_grad()
        loss.backward()
        store.collect()
        opt.step()
        store.step()
        if step >= 10:
            walls.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
    store.digests()  # the thread's last writes in
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3, loss.item()


def bound(a: argparse.Namespace, say) -> None:
    """The most any overlap can give on this machine: the serial step's parts timed at 1 thread (the work a
    training thread keeps, and the table work a second core could take), against the serial step at the intra-op
    threads the plan gives one rank (all cores), interleaved."""
    import torch

    cores = os.cpu_count() or 1
    split: list[dict[str, float]] = []
    whole: list[float] = []
    for _ in range(a.pairs):
        torch.set_num_threads(1)
        split.append(_serial_parts(a))
        torch.set_num_threads(cores)
        whole.append(_serial_parts(a)["step"])
    part = {k: statistics.median(s[k] for s in split) for k in split[0]}
    dense = part["step"] - part["lookups"] - part["store step"] - part["data"]
    serial = statistics.median(whole)
    say(f"bound: serial step at 1 thread {part['step']:.1f} ms (data draw {part['data']:.1f}, host-table lookups "
        f"{part['lookups']:.1f}, store step {part['store step']:.1f}, the dense rest {dense:.1f}); serial at {cores} "
        f"threads {serial:.1f} ms ({', '.join(f'{x:.1f}' for x in whole)}); {a.pairs} interleaved rounds, medians")
    for name, train in (("the data drawn on the training thread (as built)", dense + part["data"]),
                        ("the data drawn on the table thread too", dense)):
        other = part["step"] - train
        say(f"  ideal overlap, {name}: training thread {train:.1f} ms, the other core {other:.1f} ms -> at best "
            f"{serial / max(train, other):.2f}x the {cores}-thread serial step (no stall, no shared bandwidth)")


def _serial_parts(a: argparse.Namespace) -> dict[str, float]:
    """Medians over steps 10-39 of the serial step and of its parts, in ms."""
    import time

    model, store, opt, loss_fn, batches, _ = _build(0, a)
    spent = {"lookups": 0.0}
    lookup = store.lookup

    def timed_lookup(*args):
        t = time.perf_counter()
        out = lookup(*args)
        spent["lookups"] += time.perf_counter() - t
        return out

    store.lookup = timed_lookup
    got: dict[str, list[float]] = {"step": [], "data": [], "lookups": [], "store step": []}
    for step in range(40):
        spent["lookups"] = 0.0
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        loss = loss_fn(model(*batch[0]), batch[1])
        opt.zero_grad()
        loss.backward()
        store.collect()
        opt.step()
        t2 = time.perf_counter()
        store.step()
        t3 = time.perf_counter()
        if step >= 10:
            for k, v in (("step", t3 - t0), ("data", t1 - t0), ("lookups", spent["lookups"]), ("store step", t3 - t2)):
                got[k].append(v * 1e3)
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 1])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rows-per-table", type=int, default=153_847)
    p.add_argument("--wait-policy", default="PASSIVE")
    p.add_argument("--in-process", action="store_true")
    p.add_argument("--bound", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"bench/host_overlap.py on {os.cpu_count()} cores: {' '.join(sys.argv[1:]) or '(defaults)'}")
    if a.bound:
        bound(a, say)
    elif a.in_process:
        in_process(a, say)
    else:
        with tempfile.TemporaryDirectory(prefix="host_overlap_") as tmp:
            for ranks in a.ranks:
                compare(ranks, a, Path(tmp), say)
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
