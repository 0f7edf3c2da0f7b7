"""Old hand split vs new generic table lookup: wide_deep's host-table step time, interleaved in one invocation.

    .venv/bin/python bench/lookup_bench.py [--rows-per-table 153846] [--batch 4096] [--steps 15] [--rounds 3]
                                           [--old 622cee9] [--new HEAD]   (--new . : this checkout as it is)

"old" is commit 622cee9: the model splits itself (model.tables + table_rows() + body) and the Trainer calls
TableSet.lookup(rows_by_table). "new" is HEAD (the generic lookup came in bb44bc5): build_tables swaps each
nn.Embedding of a plain model for a TableLookup. Both run recipe=wide_deep placement.host_device_mix=1 with 1 rank
(all cores), at the sizes of bench/placement_bench.py (26 fields x 153,846 rows = 4 M rows per table, dim 16 and 1,
batch 4096), with the recipe's table optimizers (lazy Adam + FTRL) and with lazy Adam on both tables.

Each measurement is a fresh subprocess (this script with --measure) that imports `launcher` from one tree: each
revision is a detached git worktree at /tmp/hl-<old|new>-<sha> (created here when missing, e.g.
/tmp/hl-old-622cee9), so uncommitted edits in this checkout do not leak in, mapped as the editable install maps this
tree (launcher -> launcher/, launcher.recipes -> recipes/, launcher.conf -> conf/). It builds the Trainer as
a rank does (plan_launch, 1-rank gloo group, build_trainer), runs --warmup steps, then times --steps train_step()s.
Rounds alternate the order (old, new), (new, old), ... Reported: per variant the median over rounds of each run's
median wall ms/step, the min-max of those run medians, new/old (of the medians, and per round), and whether the
per-step losses agree (same seed). Shared machine: each run waits for the machine to be quiet, measures the CPU
other processes used during its timed steps (/proc/stat), and the summary keeps only clean runs where it can.
Writes bench/results/lookup.json. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = 0.25
"""A run is clean when other processes used less than this many cores, on average, during its timed steps."""
CONFIGS = {  # name -> overrides on top of recipe=wide_deep placement.host_device_mix=1
    "recipe default (lazy Adam + FTRL)": [],
    "lazy Adam on both tables": ["tables.wide_embedding.optimizer=lazy_adam", "tables.wide_embedding.lr=0.001"],
}


def busy_s() -> float:
    """CPU seconds this machine has been busy, all cores together (/proc/stat, less idle and iowait)."""
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:9]]  # user .. steal (guest time is inside user)
    return (sum(t) - t[3] - t[4]) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s: float) -> float:
    """Wait (at most limit_s) until other work uses < 0.1 core over 1 s; returns the seconds waited."""
    t0 = time.perf_counter()
    while True:
        b0 = busy_s()
        time.sleep(1.0)
        if busy_s() - b0 < 0.1 or time.perf_counter() - t0 > limit_s:
            return time.perf_counter() - t0


class _TreeFinder:
    """Meta path finder: launcher, launcher.recipes and launcher.conf from one source tree (what the editable
    install's finder does for /work/main), ahead of that finder and of sys.path."""

    def __init__(self, tree: Path) -> None:
        self.packages = {"launcher": tree / "launcher", "launcher.recipes": tree / "recipes",
                         "launcher.conf": tree / "conf"}

    def find_spec(self, fullname, path=None, target=None):
        from importlib.util import spec_from_file_location

        pkg = self.packages.get(fullname)
        return spec_from_file_location(fullname, pkg / "__init__.py") if pkg else None


def measure(a: argparse.Namespace) -> dict:
    """In the subprocess: one variant's Trainer, warm-up, then timed steps."""
    tree = Path(a.tree)
    sys.meta_path.insert(0, _TreeFinder(tree))
    import socket

    import torch
    import torch.distributed as dist

    import launcher.conf
    import launcher.recipes
    from launcher.config import compose_config
    from launcher.facts.host import probe_host
    try:
        from launcher.facts.preflight import gather_data_facts as gather
    except ImportError:  # later trees: one gather_facts for the data and the model
        from launcher.facts.preflight import gather_facts as gather
    from launcher.plan import plan_launch
    try:
        from launcher import tables as tables_mod  # later trees: the table store package
    except ImportError:
        from launcher.worker import tables as tables_mod
    from launcher.worker.mesh import build_mesh
    from launcher.worker.train import build_trainer

    for mod in (launcher, launcher.recipes, launcher.conf, tables_mod):  # the right tree, not the editable install
        if not Path(mod.__file__).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"{mod.__name__} imported from {mod.__file__}, not from {tree}")
    overrides = ["recipe=wide_deep", f"model.rows_per_table={a.rows_per_table}", f"batch.global_size={a.batch}",
                 "cluster.nproc_per_node=1", "placement.host_device_mix=1", f"trainer.steps={a.warmup + a.steps}",
                 "trainer.checkpoint_every=-1", "eval.batches=0", *CONFIGS[a.config]]
    cfg = compose_config(overrides)
    plan = plan_launch(cfg, probe_host(), gather(cfg))
    env = plan.ranks[0].env
    os.environ.update({k: env[k] for k in ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR") if k in env})  # as the rank's
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    mesh, dp = build_mesh(plan.dims, "cpu")
    t0 = time.perf_counter()
    with_mesh = "mesh" in inspect.signature(build_trainer).parameters  # later trees build the parts on the mesh
    trainer = build_trainer(plan, dp, torch.device("cpu"), 0, *([mesh] if with_mesh else []))
    build_s = time.perf_counter() - t0
    model = trainer.model if hasattr(trainer, "model") else trainer.engine.module  # later trees: the engine's
    # The code really is the variant's: old WideDeep keeps model.tables; new swaps deep_embedding for a TableLookup.
    code = "old" if hasattr(model, "tables") else \
        "new" if type(model.deep_embedding).__name__ == "TableLookup" else "unknown"
    if code != a.measure:
        raise RuntimeError(f"asked for {a.measure}, the model looks {code}: {type(model)}")
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:  # the machine's busy time, less ours: other work during the timed steps
            b0, c0, w0 = busy_s(), time.process_time(), time.perf_counter()
        t0 = time.perf_counter()
        losses.append(trainer.train_step().item())
        times.append((time.perf_counter() - t0) * 1000)
    other = ((busy_s() - b0) - (time.process_time() - c0)) / (time.perf_counter() - w0)
    dist.destroy_process_group()
    return {"code": code, "engine": plan.engine, "threads": torch.get_num_threads(), "build_s": build_s,
            "ms": times[a.warmup:], "ms_median": statistics.median(times[a.warmup:]),
            "losses": losses, "other_cores": max(0.0, other)}


def run_variant(variant: str, tree: Path, config: str, a: argparse.Namespace) -> dict:
    args = [sys.executable, str(Path(__file__).resolve()), "--measure", variant, "--tree", str(tree),
            "--config", config, f"--rows-per-table={a.rows_per_table}", f"--batch={a.batch}", f"--steps={a.steps}",
            f"--warmup={a.warmup}"]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}
    res = subprocess.run(args, cwd="/tmp", env=env, capture_output=True, text=True)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} / {config} failed (exit {res.returncode}):\n"
                           f"{res.stdout[-2000:]}{res.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def ensure_tree(variant: str, rev: str) -> tuple[Path, str]:
    """The source tree of ``rev`` ("." is this checkout as it is): a detached worktree, added when missing."""
    if rev == ".":
        return ROOT, "working tree"
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", f"{rev}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = Path(f"/tmp/hl-{variant}-{sha}")
    if tree.exists():
        print(f"{variant}: {tree} (existing worktree of {sha})", file=sys.stderr)
    else:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha], check=True,
                       capture_output=True)
        print(f"{variant}: created git worktree {tree} at {sha} (remove: git worktree remove {tree})", file=sys.stderr)
    return tree, sha


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-per-table", type=int, default=4_000_000 // 26, help="rows per field (26 fields a table)")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=15, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each variant, interleaved, order alternating")
    ap.add_argument("--old", default="622cee9", help="revision with the hand split")
    ap.add_argument("--new", default="HEAD", help="revision with the generic lookup; '.' = this checkout as it is")
    ap.add_argument("--wait-quiet", type=float, default=60, help="before each run, wait at most this many seconds "
                    "for other work on the machine to stop")
    ap.add_argument("--measure", choices=("old", "new"), help=argparse.SUPPRESS)  # subprocess mode
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--config", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print("RESULT " + json.dumps(measure(a)))
        return
    trees = {v: ensure_tree(v, rev) for v, rev in (("old", a.old), ("new", a.new))}
    runs: dict[str, dict[str, list[dict]]] = {c: {"old": [], "new": []} for c in CONFIGS}
    for r in range(a.rounds):  # interleaved, so a slow minute of the machine hits both variants alike
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for config in CONFIGS:
            for variant in order:
                waited = wait_quiet(a.wait_quiet)
                x = run_variant(variant, trees[variant][0], config, a) | {"waited_s": waited}
                runs[config][variant].append(x)
                print(f"round {r + 1}/{a.rounds}: {variant} {config}: {x['ms_median']:.1f} ms/step; other work "
                      f"{x['other_cores']:.2f} cores (waited {waited:.0f} s)", file=sys.stderr)

    cores = len(os.sched_getaffinity(0))
    print(f"\nold = {trees['old'][1]}, new = {trees['new'][1]}; wide_deep host tables, {a.rows_per_table * 26:,} rows "
          f"per table (26 x {a.rows_per_table:,}; d=16 and d=1), batch {a.batch}, 1 rank, {cores} cores; each run the "
          f"median of {a.steps} steps after {a.warmup} warm-up; median (min-max) over {a.rounds} interleaved rounds, "
          f"only over the clean ones (other work < {QUIET} core during the run) where there are any\n")
    print("| tables' optimizers | old ms/step | new ms/step | new/old | new/old per round | clean runs old, new |")
    print("|---|---:|---:|---:|---:|---:|")
    summary = {}
    for config, by in runs.items():
        clean = {v: [x["other_cores"] < QUIET for x in by[v]] for v in by}
        med = {v: [x["ms_median"] for x, ok in zip(by[v], clean[v]) if ok or not any(clean[v])] for v in by}
        pairs = [(n["ms_median"], o["ms_median"], cn and co)
                 for n, o, cn, co in zip(by["new"], by["old"], clean["new"], clean["old"])]
        ratios = [n / o for n, o, ok in pairs if ok or not any(p[2] for p in pairs)]
        summary[config] = {v: {"ms_median": statistics.median(m), "min": min(m), "max": max(m)}
                           for v, m in med.items()}
        summary[config]["ratio"] = summary[config]["new"]["ms_median"] / summary[config]["old"]["ms_median"]
        summary[config]["build_s_median"] = {v: statistics.median(x["build_s"] for x in by[v]) for v in by}
        cell = {v: f"{statistics.median(m):.1f} ({min(m):.1f}-{max(m):.1f})" for v, m in med.items()}
        print(f"| {config} | {cell['old']} | {cell['new']} | {summary[config]['ratio']:.3f} | "
              f"{min(ratios):.3f}-{max(ratios):.3f} | {sum(clean['old'])}/{a.rounds}, {sum(clean['new'])}/{a.rounds} |")

    print(f"\nlosses, same seed, all {a.warmup + a.steps} steps of each run vs the first old run:")
    for config, by in runs.items():
        ref = by["old"][0]["losses"]
        diff = {v: max(abs(x - y) for run in by[v] for x, y in zip(run["losses"], ref)) for v in by}
        summary[config]["max_loss_diff"] = diff
        verdict = "identical" if diff["new"] == 0 else "agree (<= 1e-6)" if diff["new"] <= 1e-6 else "DIFFER"
        firsts = {v: ", ".join(f"{x:.7f}" for x in by[v][0]["losses"][:3]) for v in by}
        print(f"  {config}: max |new - old| {diff['new']:.1e} ({verdict}), old run to run {diff['old']:.1e}; "
              f"first 3 steps old [{firsts['old']}] new [{firsts['new']}]")
    every = [x for by in runs.values() for v in by.values() for x in v]
    print(f"engine: {', '.join(sorted({x['engine'] for x in every}))}; torch threads per run: {every[0]['threads']}; "
          f"Trainer build s (median) " + ", ".join(f"{c}: old {s['build_s_median']['old']:.2f} new "
                                                   f"{s['build_s_median']['new']:.2f}" for c, s in summary.items()))
    if not all(x["other_cores"] < QUIET for x in every):
        print(f"note: other work shared the machine in {sum(x['other_cores'] >= QUIET for x in every)} of "
              f"{len(every)} runs (up to {max(x['other_cores'] for x in every):.2f} cores); those are left out "
              f"where a clean run exists. More --rounds, or a quiet machine, for firmer figures.")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    revisions = {v: t[1] for v, t in trees.items()}
    (out / "lookup.json").write_text(json.dumps(
        {"args": vars(a), "revisions": revisions, "summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
