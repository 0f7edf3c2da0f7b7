"""The benchmark suite: one command, every figure a ratio measured side by side in this invocation.

    .venv/bin/python bench/suite.py [--runs 5] [--only P1 P4 ...] [--plan-only]

P1 launch overhead: a trivial 2-rank gloo job via hetero-launch script=, torchrun, the deepspeed launcher; a dry run;
   a quickstart smoke run through each launch backend (local, elastic, mpi and slurm where installed).
P2 wide_deep host placement: samples/s of host sparse tables vs dense tables (both through hetero-launch, 1 rank),
   lookups/s vs a plain gather's bound.
P3 offloaded optimizer step: DeepSpeedCPUAdam vs torch.optim.Adam(fused) at 32 M parameters.
P4 quickstart step time: hetero-launch's data_parallel=auto (torch DDP) and data_parallel=deepspeed (ZeRO-0) vs a hand-written DDP
   loop, over the same 20-step windows.
P5 cost growth: plan time for 10 / 100 / 1,000 / 10,000 tables; the dry run after composing (plan, print, run dir)
   for 10 / 10,000; launch-to-first-step for 1 / 2 / 4 / 8 ranks (--plan-only leaves that out).
Runs of one comparison are interleaved (a, b, c, a, b, c, ...) and each figure is the median of --runs runs.
Prints a markdown table and writes bench/results/suite.json. Not a test: the numbers belong to this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
PY = sys.executable
BIN = Path(PY).parent

from launcher.rundir import RunDir  # noqa: E402


def timed(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}")
    return time.perf_counter() - t0


def interleaved(fns: dict, runs: int) -> dict[str, list]:
    out = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            out[k].append(fn())
    return out


def med(xs):
    return statistics.median(xs)


def p1(runs: int) -> list[tuple]:
    script = str(BENCH / "trivial_gloo.py")
    with tempfile.TemporaryDirectory() as tmp:
        fns = {
            "hetero-launch script=": lambda: timed([str(BIN / "hetero-launch"), f"script={script}", "cluster.nproc_per_node=2"], cwd=tmp),
            "torchrun": lambda: timed([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", script], cwd=tmp),
            "deepspeed launcher": lambda: timed([str(BIN / "deepspeed"), "--num_gpus", "2", script], {"DS_ACCELERATOR": "cpu"}, cwd=tmp),
            "dry run (recipe=wide_deep)": lambda: timed([str(BIN / "hetero-launch"), "recipe=wide_deep", "dry_run=true"], cwd=tmp),
        }
        r = interleaved(fns, runs)
    base = med(r["torchrun"])
    rows = [("P1", f"trivial 2-rank gloo job: {k}", f"{med(v):.2f} s [{min(v):.2f}-{max(v):.2f}]",
             f"{med(v) / base:.2f}x torchrun") for k, v in r.items()]
    # The same recipe run through each launch backend (one host: elastic's rendezvous with one node; mpirun; srun
    # inside `salloc` on the tests' single-host Slurm cluster), where this machine has them.
    smoke = [str(BIN / "hetero-launch"), "recipe=quickstart", "smoke=true"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        backends = {
            "local": lambda: timed(smoke, cwd=tmp),
            "elastic (c10d rendezvous, 1 node)": lambda: timed(
                [*smoke, "cluster.launch=elastic", f"cluster.rdzv_endpoint=127.0.0.1:{_free_port()}",
                 "cluster.local_addr=127.0.0.1"], cwd=tmp),
        }
        if shutil.which("mpirun"):
            backends["mpi (mpirun)"] = lambda: timed([*smoke, "cluster.launch=mpi"], cwd=tmp)
        slurm = _slurm_cluster(stack, Path(tmp) / "slurm")
        if slurm is not None:
            salloc = ["salloc", "--nodes=1", "--ntasks-per-node=2", *smoke, "cluster.launch=slurm"]
            backends["slurm (srun inside salloc)"] = lambda: timed(salloc, slurm.env, cwd=tmp)
        b = interleaved(backends, runs)
    local = med(b["local"])
    rows += [("P1", f"quickstart smoke run, cluster.launch={k}", f"{med(v):.2f} s [{min(v):.2f}-{max(v):.2f}]",
              f"{med(v) / local:.2f}x local") for k, v in b.items()]
    return rows


def _slurm_cluster(stack: contextlib.ExitStack, root: Path):
    """The tests' single-host Slurm cluster (tests/slurm_cluster.py), or None (with a line saying why)."""
    sys.path.insert(0, str(ROOT))
    from tests.slurm_cluster import Unavailable, running_cluster

    root.mkdir()
    try:
        return stack.enter_context(running_cluster(root))
    except Unavailable as e:
        print(f"P1: no Slurm backend figure: {str(e).splitlines()[0]}", file=sys.stderr)
        return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def p2(runs: int) -> list[tuple]:
    from placement_bench import gather_bound, launcher_run

    rows_per, batch, steps, warm = 1_000_000 // 26, 4096, 10, 3
    sparse = ["placement.host_device_mix=1"]
    dense = ["tables.deep_embedding.optimizer=dense", "tables.wide_embedding.optimizer=dense"]
    r = interleaved({
        "host sparse tables (lazy Adam + FTRL)": lambda: launcher_run(rows_per, batch, steps, warm, 1, sparse),
        "dense tables, dense Adam in the engine": lambda: launcher_run(rows_per, batch, steps, warm, 1, dense),
    }, runs)
    bound = gather_bound(rows_per, batch, skewed=True)
    s = med([x["samples_per_s"] for x in r["host sparse tables (lazy Adam + FTRL)"]])
    d = med([x["samples_per_s"] for x in r["dense tables, dense Adam in the engine"]])
    return [
        ("P2", "wide_deep 1 M rows/table, batch 4096, 1 rank: host sparse", f"{s:,.0f} samples/s", f"{s / d:.2f}x dense"),
        ("P2", "... dense tables inside the engine", f"{d:,.0f} samples/s", "1.00x"),
        ("P2", "... host sparse lookups/s vs plain gather bound", f"{s * 26 / 1e6:.2f} M/s", f"{s * 26 / bound:.1%} of {bound / 1e6:.0f} M/s"),
    ]


def p3(runs: int) -> list[tuple]:
    from optimizer_bench import make

    import torch

    opts = {k: make(k, 32_000_000) for k in ("torch Adam fused", "DeepSpeedCPUAdam")}
    for o in opts.values():
        o.step()

    def step(o):
        t0 = time.perf_counter()
        o.step()
        return (time.perf_counter() - t0) * 1000

    r = interleaved({k: (lambda o=o: step(o)) for k, o in opts.items()}, max(runs, 5) * 3)
    del torch
    f, ds = med(r["torch Adam fused"]), med(r["DeepSpeedCPUAdam"])
    return [("P3", "Adam step, 32 M params, host: torch fused", f"{f:.1f} ms", "1.00x"),
            ("P3", "... DeepSpeedCPUAdam", f"{ds:.1f} ms", f"{ds / f:.2f}x torch fused")]


def p4(runs: int) -> list[tuple]:
    """Step time over the same windows (steps 21..200, in 20-step windows) for all three, interleaved."""
    steps = 200

    def launcher(*extra: str):
        with tempfile.TemporaryDirectory() as tmp:
            timed([str(BIN / "hetero-launch"), "recipe=quickstart", f"trainer.steps={steps}", "trainer.log_every=20",
                   "trainer.checkpoint_every=-1", "eval.batches=0", *extra], cwd=tmp)
            recs = RunDir(Path(tmp) / "log_output" / "latest").rank(0).read_metrics()
        rates = [x["samples_per_s"] for x in recs if x["step"] > 20]  # each: the mean rate over 20 steps
        return 32 / med(rates) * 1000

    def ddp():
        res = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2",
                              str(BENCH / "ddp_quickstart.py"), str(steps)], capture_output=True, text=True)
        return float(re.search(r"window_step_ms=([\d.]+)", res.stdout).group(1))

    r = interleaved({"auto": launcher, "deepspeed": lambda: launcher("parallel.data_parallel=deepspeed"), "ddp": ddp}, runs)
    a, d, b = med(r["auto"]), med(r["deepspeed"]), med(r["ddp"])
    spread = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in r.items()}
    return [("P4", f"quickstart step, 2 ranks: hetero-launch parallel.data_parallel=auto (torch DDP) [{spread['auto']}]",
             f"{a:.2f} ms", f"{a / b:.2f}x hand DDP"),
            ("P4", f"... hetero-launch parallel.data_parallel=deepspeed (ZeRO-0) [{spread['deepspeed']}]", f"{d:.2f} ms",
             f"{d / b:.2f}x hand DDP"),
            ("P4", f"... hand-written DDP loop (torchrun) [{spread['ddp']}]", f"{b:.2f} ms", "1.00x")]


def p5(runs: int, plan_only: bool = False) -> list[tuple]:
    rows = _plan_times(runs) + _dry_run_times(runs)
    if plan_only:
        return rows

    def first_step(nproc: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            timed([str(BIN / "hetero-launch"), "recipe=quickstart", f"cluster.nproc_per_node={nproc}",
                   f"batch.micro_size={32 // nproc}", "trainer.steps=2", "trainer.checkpoint_every=-1", "eval.batches=0"], cwd=tmp)
            first = RunDir(Path(tmp) / "log_output" / "latest").rank(0).read_metrics()[0]
        return first["time"] - t0

    r = interleaved({n: (lambda n=n: first_step(n)) for n in (1, 2, 4, 8)}, runs)
    one = med(r[1])
    rows += [("P5", f"launch to first step, quickstart, {n} rank(s)", f"{med(v):.1f} s", f"{med(v) / one:.2f}x 1 rank")
             for n, v in r.items()]
    return rows


def _with_tables(cfg, n: int):
    """cfg planning a stand-in recipe with n tables, each with a tables.<name> entry (half lazy_adam, half ftrl)."""
    from omegaconf import open_dict

    from launcher.schema import TableConfig

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.recipe.name = "bench_tables"
        cfg.tables = {f"t{i}": TableConfig(optimizer="lazy_adam" if i % 2 else "ftrl") for i in range(n)}
    return cfg


def _timed_ms(fn) -> float:
    """One call's wall time in ms, collected garbage first: each run starts as a fresh command's planning would, not
    with the cyclic collector's debt from the runs before it (with 10,000 tables a full collection is ~0.2 s)."""
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _spread(xs: list[float]) -> str:
    return f"{med(xs):.1f} ms [{min(xs):.1f}-{max(xs):.1f}]"


def _plan_times(runs: int) -> list[tuple]:
    """plan_launch alone, for 10 / 100 / 1,000 / 10,000 tables."""
    from launcher.backends import BACKENDS
    from launcher.config import compose_config
    from launcher.contract import Facts
    from launcher.plan import HostFacts, plan_launch
    from launcher.recipes import RECIPES

    host, facts = HostFacts("bench", 2, 0, "/tmp/x"), Facts(backends=tuple(BACKENDS.values()))
    out = []
    base_cfg = compose_config(["recipe=wide_deep"])
    for n in (10, 100, 1_000, 10_000):
        RECIPES["bench_tables"] = types.SimpleNamespace(
            tables=lambda m, n=n: {f"t{i}": (1000, 16) for i in range(n)}, model_spec=lambda m, f: {},
            dense_param_count=lambda m: 100_000, problems=lambda *a: [], layer_names=lambda m: [])
        cfg = _with_tables(base_cfg, n)
        out.append((n, [_timed_ms(lambda: plan_launch(cfg, host, facts)) for _ in range(runs)]))
    del RECIPES["bench_tables"]
    base = med(out[0][1])
    return [("P5", f"plan time, {n:,} tables", _spread(t), f"{med(t) / base:.1f}x 10 tables") for n, t in out]


class _ManyTables:
    """wide_deep's recipe with n tables of 1,000 × 16 (the model is never built in a dry run)."""

    name = "bench_tables"

    def __init__(self, recipe, n: int) -> None:
        self._recipe, self._n = recipe, n

    def __getattr__(self, key: str):
        return getattr(self._recipe, key)

    def tables(self, model: dict) -> dict[str, tuple[int, int]]:
        return {f"t{i}": (1000, 16) for i in range(self._n)}


def _dry_run_times(runs: int) -> list[tuple]:
    """The dry run's path after composing, for 10 and 10,000 tables: plan_run (data facts, plan), the plan tree and
    placement table printed (to a buffer), the run dir written (config.yaml, plan.json, ...). Hydra's composing of
    10,000 tables.<name> entries is left out: the entries are added to a composed config."""
    import io

    from rich.console import Console

    from launcher.config import compose_config
    from launcher.launch import write_dry_run
    from launcher.facts.host import probe_host
    from launcher.launch.planning import plan_run
    from launcher.recipes import RECIPES
    from launcher.report.plan_view import placement_table, plan_tree

    host, out = probe_host(), []
    with tempfile.TemporaryDirectory() as tmp:
        base_cfg = compose_config(["recipe=wide_deep", "dry_run=true", f"output.log_dir={tmp}"])

        def dry_run(cfg) -> None:
            plan, _ = plan_run(cfg, host)
            console = Console(file=io.StringIO(), width=100)
            console.print(plan_tree(plan))
            console.print(placement_table(plan))
            write_dry_run(cfg, plan, [])

        for n in (10, 10_000):
            RECIPES["bench_tables"] = _ManyTables(RECIPES["wide_deep"], n)
            cfg = _with_tables(base_cfg, n)
            out.append((n, [_timed_ms(lambda: dry_run(cfg)) for _ in range(runs)]))
        del RECIPES["bench_tables"]
    base = med(out[0][1])
    return [("P5", f"dry run after composing (plan, print, run dir), {n:,} tables", _spread(t),
             f"{med(t) / base:.1f}x 10 tables") for n, t in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=["P1", "P2", "P3", "P4", "P5"])
    ap.add_argument("--plan-only", action="store_true", help="P5: plan and dry-run times, no launch to first step")
    a = ap.parse_args()
    parts = {"P1": p1, "P2": p2, "P3": p3, "P4": p4, "P5": lambda runs: p5(runs, a.plan_only)}
    rows = []
    for name in a.only:
        t0 = time.perf_counter()
        rows += parts[name](a.runs)
        print(f"{name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    machine = f"{platform.node()}, {len(os.sched_getaffinity(0))} cores, {platform.processor() or platform.machine()}"
    print(f"\nhetero-launch benchmark suite: median of {a.runs} interleaved runs; {machine}\n")
    print("| | what | measured | ratio |")
    print("|---|---|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    out = BENCH / "results"
    out.mkdir(exist_ok=True)
    (out / "suite.json").write_text(json.dumps({"runs": a.runs, "machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
