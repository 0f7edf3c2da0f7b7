"""The same runs on the code before the parallel parts (issue 19) and after: step times, interleaved in one invocation.

    .venv/bin/python bench/before_after.py [--old aa97f2f] [--new .] [--rounds 3] [--steps 60] [--only dry]

"old" is commit aa97f2f (four exclusive engines: torch DDP, DeepSpeed, DeepSpeed's PipelineModule, the DTensor tp
engine); "new" is this checkout as it is ("."; or a revision). Each revision runs from its own source tree (a detached
git worktree at /tmp/hl-old-<sha>, created when missing) through a package dir that maps it as the editable install
maps this checkout (launcher -> launcher/, launcher.recipes -> recipes/, launcher.conf -> conf/), put first on
PYTHONPATH: the launcher and its ranks import that tree's code. The variants (each on both trees, rounds alternating
the order of the trees):

  gpt one process   gpt, global batch 32, 1 rank, 4 micro-batches accumulated
  gpt pp 2, M=4     2 ranks, 2 pipeline stages, 4 micro-batches (old: DeepSpeed's pipeline engine)
  gpt tp 2          2 ranks, tp 2 (old: the DTensor tp engine), 4 micro-batches accumulated
  quickstart DDP    quickstart, 2 ranks, torch DDP
  dry run <recipe>  the launcher's own path before any rank: compose, facts, plan, print (``dry_run=true``), as a
                    process's wall time (imports included): wide_deep, gpt with 2 stages, a ds_config.json adopted

``--only dry`` runs the dry runs alone (a move of modules changes no step, but may change imports and planning).
``--only plans`` compares the plans instead: plan.json of every shipped recipe under 14 compositions and of the
composability matrix (bench/composability.py: gpt and wide_deep on 4 ranks, each intent and every pair), each tree
planning in its own process; prints how many are byte-identical and names the others (a refusal counts by its
problems).
Step time = the median over 10-step windows after the first 10 steps (metrics.jsonl's wall_s) per run; printed per
variant: the median over rounds [min-max], new / old. Not a test: the figures belong to the machine.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_bench import step_time  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT = ["recipe=gpt", "batch.global_size=32", "batch.micro_size=-1"]
VARIANTS = {
    "gpt one process (M=4 accumulated)": [*GPT, "cluster.nproc_per_node=1", "batch.grad_accum=4",
                                          "parallel.pipeline_stages=1"],
    "gpt pp 2, M=4": [*GPT, "cluster.nproc_per_node=2", "parallel.pipeline_stages=2", "batch.micro_batches=4"],
    "gpt tp 2 (M=4 accumulated)": [*GPT, "cluster.nproc_per_node=2", "parallel.tp=2", "batch.grad_accum=4",
                                   "parallel.pipeline_stages=1"],
    "quickstart DDP, 2 ranks": ["recipe=quickstart", "cluster.nproc_per_node=2"],
}
DRY = {
    "dry run wide_deep": ["recipe=wide_deep"],
    "dry run gpt, 2 stages": [*GPT, "cluster.nproc_per_node=2", "parallel.pipeline_stages=2"],
    "dry run quickstart, zero 2 offload": ["recipe=quickstart", "zero.stage=2", "optimizer.target=CPU"],
}


def source_tree(rev: str) -> Path:
    """The tree of ``rev`` ("." = this checkout): a detached worktree, added when missing."""
    if rev == ".":
        return ROOT
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(f"/tmp/hl-old-{sha}")
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha], check=True,
                       capture_output=True)
        print(f"created git worktree {tree} at {sha} (remove: git worktree remove {tree})", file=sys.stderr)
    return tree


def package_dir(tree: Path, into: Path) -> Path:
    """A dir whose ``launcher`` package is ``tree``'s, with its recipes/ and conf/ inside, as the install maps them."""
    pkg = into / "launcher"
    pkg.mkdir(parents=True)
    for entry in (tree / "launcher").iterdir():
        (pkg / entry.name).symlink_to(entry)
    (pkg / "recipes").symlink_to(tree / "recipes")
    (pkg / "conf").symlink_to(tree / "conf")
    return into


def tree_sha(rev: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD" if rev == "." else rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def ran_tree(run_dir: Path, summary: dict, sha: str, parts: bool) -> bool:
    """The ranks ran the tree asked for: versions.json's git hash (the launcher's own checkout, symlinks resolved),
    or, in a run dir from before versions.json had it, whether the summary has the parts (the new code's)."""
    versions = run_dir / "versions.json"
    git = json.loads(versions.read_text()).get("git", "") if versions.exists() else ""
    return git.startswith(sha) if git and not git.startswith("unknown") else ("parts" in summary) == parts


def run(pythonpath: Path, cwd: Path, name: str, overrides: list[str], steps: int, parts: bool, sha: str) -> float:
    cmd = [sys.executable, "-m", "launcher.cli", *overrides, f"trainer.steps={steps}", f"output.run_name={name}",
           "trainer.checkpoint_every=-1", "eval.batches=0", "trainer.log_every=10"]
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    summary = json.loads((cwd / "log_output" / name / "summary.json").read_text())
    if not ran_tree(cwd / "log_output" / name, summary, sha, parts):
        raise RuntimeError(f"{name}: expected the {'new' if parts else 'old'} code ({sha[:8]}), got {summary}")
    return step_time(cwd / "log_output" / name, 10)


PLANS = r"""
import itertools, json, sys
from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.plan import HostFacts, plan_launch
from launcher.recipes import RECIPES
try:
    from launcher.facts.preflight import gather_facts
except ImportError:  # before launcher/facts/
    from launcher.launch.preflight import gather_facts
sys.path.insert(0, sys.argv[1])
import composability as c
host = HostFacts("h", 8, 0, "/x")
combos = [[], ["zero.stage=2"], ["zero.stage=3"], ["optimizer.target=CPU"], ["parallel.pipeline_stages=2"],
          ["placement.host_device_mix=1"], ["recompute=[all]"], ["parallel.tp=2"], ["placement=auto"],
          ["cluster.nproc_per_node=4", "parallel.data_parallel=fsdp"], ["smoke=true"], ["placement.ps=true"],
          ["precision=bf16", "zero.stage=1"], ["cluster.nnodes=2"]]
out = {}
for r in sorted(RECIPES):
    for o in combos:
        try:
            cfg = compose_config([f"recipe={r}", *o])
            out[f"{r} {o}"] = plan_launch(cfg, host, gather_facts(cfg)).to_dict()
        except ConfigError as e:
            out[f"{r} {o}"] = {"refused": e.problems}
for r in ("gpt", "wide_deep"):
    plans, refused = c.plan_all(r, c.WORLD, c.combinations())
    out |= plans | {k: {"refused": v} for k, v in refused.items()}
print(json.dumps(out, sort_keys=True, default=str))
"""


def plans_of(pythonpath: Path, tree: Path) -> dict:
    """Every plan the PLANS program makes on ``tree`` (its own bench/composability.py)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    res = subprocess.run([sys.executable, "-c", PLANS, str(tree / "bench")], env=env, capture_output=True, text=True,
                         cwd=tree)
    if res.returncode != 0:
        raise RuntimeError(f"planning on {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def compare_plans(paths: dict[str, Path], trees: dict[str, Path]) -> None:
    old, new = (plans_of(paths[t], trees[t]) for t in ("old", "new"))
    same = [k for k in old if k in new and json.dumps(old[k], sort_keys=True) == json.dumps(new[k], sort_keys=True)]
    print(f"{len(same)} of {len(old)} plans byte-identical ({len(new)} on the new tree)")
    for k in sorted(set(old) | set(new)):
        if k not in same:
            print(f"  differs: {k}")


def dry_run(pythonpath: Path, cwd: Path, overrides: list[str]) -> float:
    """Seconds a ``dry_run=true`` process takes, start to exit."""
    cmd = [sys.executable, "-m", "launcher.cli", *overrides, "dry_run=true"]
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="aa97f2f")
    ap.add_argument("--new", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--only", choices=("dry", "steps", "plans"), default=None)
    args = ap.parse_args()
    if args.only == "plans":
        with tempfile.TemporaryDirectory() as tmp:
            trees = {"old": source_tree(args.old), "new": source_tree(args.new)}
            compare_plans({t: package_dir(trees[t], Path(tmp) / t) for t in trees}, trees)
        return
    variants = {**(VARIANTS if args.only != "dry" else {}), **(DRY if args.only != "steps" else {})}
    times = {(v, t): [] for v in variants for t in ("old", "new")}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {t: package_dir(source_tree(rev), Path(tmp) / t) for t, rev in (("old", args.old), ("new", args.new))}
        old_sha = tree_sha(args.old)
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for i, (variant, overrides) in enumerate(variants.items()):
                for t in order:
                    if variant in DRY:
                        times[(variant, t)].append(dry_run(paths[t], Path(tmp), overrides))
                        continue
                    times[(variant, t)].append(run(paths[t], Path(tmp), f"r{r}v{i}{t}", overrides, args.steps,
                                                     parts=t == "new",
                                                     sha=old_sha if t == "old" else tree_sha(args.new)))
                    print(f"round {r + 1}: {variant} ({t}): {times[(variant, t)][-1] * 1e3:.1f} ms", file=sys.stderr)
    print(f"old = {args.old}, new = {args.new}; {args.steps} steps, median of {args.rounds} interleaved rounds\n")
    print("| run | old ms (a step; a dry run: the process) [rounds] | new ms [rounds] | new / old |")
    print("|---|---:|---:|---:|")
    for variant in variants:
        old, new = times[(variant, "old")], times[(variant, "new")]
        cell = lambda t: f"{statistics.median(t) * 1e3:.1f} [{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}]"  # noqa: E731
        print(f"| {variant} | {cell(old)} | {cell(new)} | {statistics.median(new) / statistics.median(old):.2f}x |")


if __name__ == "__main__":
    main()
