"""The composability matrix: each of nine intents alone and every pair of them (42 combinations: the three ZeRO stages
do not pair with each other), on gpt and on wide_deep, at their smoke shapes on 4 gloo ranks.

Each combination is planned here exactly as the launcher plans it (compose_config, gather_facts, plan_launch): it
plans, or it is refused with the launcher's own message. Every plan is then trained, 3 optimizer steps and an
evaluation, in one launched 4-rank job (``hetero-launch script=bench/composability_ranks.py``: the worker's own
build_trainer / train_step in each rank), and its per-step losses are compared with a one-process run of the same
recipe at the same global batch and micro-batches with the same data-parallel part, ZeRO stage, precision, offload,
tables and recompute (only the layout is taken away: tensor parallel, pipeline stages, the other ranks), launched
the same way in one 1-rank job.

    .venv/bin/python bench/composability.py [--recipes gpt wide_deep] [--steps 3] [--triples] [--json PATH]

Prints the matrix (markdown: per combination the parts it ran on, the worst relative loss difference against one
process, whether every rank holds the parameters, optimizer states and tables its plan estimates: a part that did
not apply would train the one-process losses but hold the whole model) and the counts. The test (tests/integration/test_composability.py) runs the same and
holds fp32 compositions to 1e-5 (1e-4 with tensor parallel) and bf16 ones to BF16_TOLERANCE.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INTENTS: dict[str, list[str]] = {
    "host tables": ["placement.host_device_mix=1"],
    "CPU optimizer": ["optimizer.target=CPU"],
    "ZeRO-1": ["zero.stage=1"],
    "ZeRO-2": ["zero.stage=2"],
    "ZeRO-3": ["zero.stage=3"],
    "bf16": ["precision=bf16"],
    "pp 2": ["parallel.pipeline_stages=2"],
    "tp 2": ["parallel.tp=2"],
    "recompute": ["recompute=[all]"],
}
BASE = ["smoke=true", "batch.global_size=32", "batch.micro_batches=4", "eval.batches=4", "eval.max_batches=4"]
"""Every combination and its reference: the recipe's smoke shapes, one global batch of 32 in 4 micro-batches
(dp 4: 2 samples each, one process: 8), one held-out batch."""
FAST = {"gpt": ["optimizer.lr=0.01"], "wide_deep": ["optimizer.lr=0.02", "tables.deep_embedding.lr=0.05"]}
"""Learning rates at which every step moves the loss by far more than the fp32 tolerances (gpt ~0.3 % a step,
wide_deep 2-3 %): a layout whose step did the wrong thing (or nothing) cannot hide inside them. In bf16 only
wide_deep's steps move the loss by more than BF16_TOLERANCE."""
WORLD = 4
FP32_TOLERANCE, TP_TOLERANCE = 1e-5, 1e-4
BF16_TOLERANCE = 5e-3
"""Relative per-step loss difference allowed between a bf16 composition and the one-process bf16 run of the same
parts: bf16 keeps 8 bits of mantissa, a relative rounding step of 2^-8 = 3.9e-3, and a layout changes which values
are summed in which order before they are rounded (matmuls blocked over another batch split, gradients reduced over
other ranks), so a loss may differ by about one rounding step; Adam's m/sqrt(v) carries such differences into the
next steps' weights. Measured: at most 2.2e-3 over 3 steps (docs/parallelism.md). Against a one-process run of
another part (DeepSpeed's ZeRO-0 BF16_Optimizer accumulates micro-batch gradients in fp32, ZeRO-1..3 and FSDP2's
unsharded gradients in bf16) the spread is 7.9e-3: that is a difference of method, not of layout."""


def combinations(size: int = 2) -> list[tuple[str, ...]]:
    """Each intent alone and every pair (``size`` 2), or every triple (``size`` 3); never two ZeRO stages."""
    names = list(INTENTS)
    some = [c for c in itertools.combinations(names, size) if sum(n.startswith("ZeRO") for n in c) <= 1]
    return [(n,) for n in names] + some if size == 2 else some


ONE_PROCESS = ["parallel.pipeline_stages=1", "parallel.tp=1"]
"""What a one-process reference sets: the layout a single rank can have (a recipe's own pipeline goes too)."""
LAYOUT_KEYS = ("parallel.pipeline_stages=", "parallel.tp=", "parallel.sync_batchnorm=")
"""Intents a one-process reference drops: they need several ranks (sync_batchnorm: its statistics span dp, and one
process is what it equals)."""


def key(recipe: str, combo: tuple[str, ...], data_parallel: str = "") -> str:
    part = f" on {data_parallel}" if data_parallel else ""
    return f"{recipe}: {' + '.join(combo) or 'nothing'}{part}"


def reference_of(combo: tuple[str, ...], intents: dict[str, list[str]]) -> tuple[str, ...]:
    """The combination without the intents that need several ranks (tensor parallel, pipeline stages)."""
    return tuple(n for n in combo if not any(o.startswith(LAYOUT_KEYS) for o in intents[n]))


def plan_all(recipe: str, world: int, combos: list[tuple[str, ...]], intents: dict[str, list[str]] = INTENTS,
             data_parallel: dict[tuple[str, ...], str] | None = None, config_dir: str | None = None,
             base: list[str] | None = None) -> tuple[dict, dict]:
    """({key: plan as a dict}, {key: the refusal's problems}) as the launcher plans them; ``data_parallel``: the
    data-parallel part to force per combination (a one-process reference runs the part its combination got).
    ``config_dir``: a user's config tree (--config-dir) holding the recipe; ``base``: the overrides every
    combination starts from (BASE and the recipe's FAST learning rates by default)."""
    from launcher.config import compose_config
    from launcher.errors import ConfigError
    from launcher.facts.host import probe_host
    from launcher.facts.preflight import gather_facts
    from launcher.plan import plan_launch

    host = probe_host()
    plans, refused = {}, {}
    for combo in combos:
        dp = (data_parallel or {}).get(combo, "")
        reference = [*ONE_PROCESS, f"parallel.data_parallel={dp}"] if dp else []
        start = [*BASE, *FAST.get(recipe, [])] if base is None else base
        overrides = [f"recipe={recipe}", *start, f"cluster.nproc_per_node={world}",
                     *(o for name in combo for o in intents[name]), *reference]
        try:
            cfg = compose_config(overrides, config_dir)
            plans[key(recipe, combo, dp)] = plan_launch(cfg, host, gather_facts(cfg, config_dir)).to_dict()
        except ConfigError as e:
            refused[key(recipe, combo, dp)] = list(e.problems)
    return plans, refused


def train(plans: dict, world: int, steps: int, workdir: Path) -> dict:
    """Every plan trained in one ``hetero-launch script=`` job of ``world`` ranks: {key: {losses, eval, seconds}}.
    ``optimizer.target=CPU`` makes the script run's own plan need DeepSpeed, so the launcher builds DeepSpeed's shm
    op before the ranks start, as for any DeepSpeed run."""
    workdir.mkdir(parents=True, exist_ok=True)
    plans_path, out_path = workdir / f"plans{world}.json", workdir / f"results{world}.json"
    plans_path.write_text(json.dumps(plans))
    cmd = [sys.executable, "-m", "launcher.cli", f"script={ROOT / 'bench' / 'composability_ranks.py'}",
           f"cluster.nproc_per_node={world}", "optimizer.target=CPU", "launcher.watchdog_s=0",
           f"output.log_dir={workdir / 'log_output'}", "--", str(plans_path), str(out_path), str(steps)]
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    errors = sorted(workdir.glob(f"results{world}.json.error.*"))
    if errors:
        e = json.loads(errors[0].read_text())
        raise RuntimeError(f"{e['key']} failed in the ranks: {e['error']}\n{e['traceback']}")
    if res.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"the {world}-rank job failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(out_path.read_text())


def worst(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def tolerance(plan: dict) -> float:
    if plan["precision"] != "fp32":
        return BF16_TOLERANCE
    return TP_TOLERANCE if plan["dims"]["tp"] > 1 else FP32_TOLERANCE


def run(recipes: list[str], steps: int, workdir: Path, intents: dict[str, list[str]] = INTENTS,
        combos: list[tuple[str, ...]] | None = None, world: int = WORLD, config_dir: str | None = None,
        base: list[str] | None = None) -> dict:
    """Plan, train and compare: {"rows": [...], "refused": {...}} for every recipe and combination of ``intents``
    (by default each alone and every pair), on ``world`` ranks against one process (``config_dir``, ``base``: as
    plan_all's)."""
    combos = combos if combos is not None else combinations()
    ref_plans, matrix_plans, refused, ref_key = {}, {}, {}, {}
    for recipe in recipes:
        planned, no = plan_all(recipe, world, combos, intents, config_dir=config_dir, base=base)
        matrix_plans.update(planned)
        refused.update(no)
        pairs = set()
        for combo in combos:
            if key(recipe, combo) in planned:
                pair = (reference_of(combo, intents), data_parallel_of(planned[key(recipe, combo)]))
                ref_key[key(recipe, combo)] = key(recipe, *pair)
                pairs.add(pair)
        for combo, dp in sorted(pairs):
            refs_planned, refs_refused = plan_all(recipe, 1, [combo], intents, {combo: dp}, config_dir, base)
            ref_plans.update(refs_planned)
            refused.update(refs_refused)
    t0 = time.perf_counter()
    refs = train(ref_plans, 1, steps, workdir)
    results = train(matrix_plans, world, steps, workdir)
    rows = []
    for recipe in recipes:
        for combo in combos:
            k = key(recipe, combo)
            row = {"recipe": recipe, "combo": list(combo), "key": k}
            if k in refused:
                rows.append({**row, "status": "refused", "why": refused[k]})
                continue
            ref, ref_eval = refs[ref_key[k]]["losses"], refs[ref_key[k]]["eval"]
            got = results[k]
            parts = "+".join(p["name"] for p in matrix_plans[k]["parts"])
            rows.append({**row, "status": "trained", "parts": parts, "losses": got["losses"], "reference": ref,
                         "worst": worst(got["losses"], ref), "tolerance": tolerance(matrix_plans[k]),
                         "eval": got["eval"], "reference_eval": ref_eval, "held": got["held"],
                         "planned": planned_bytes(matrix_plans[k]), "seconds": got["seconds"]})
    return {"rows": rows, "refused": refused, "seconds": round(time.perf_counter() - t0, 1), "steps": steps}


KINDS = ("params", "optimizer", "tables")


def planned_bytes(plan: dict) -> list[dict[str, int]]:
    """Per rank, the plan's estimate of the bytes of parameters, optimizer states and tables it holds (host and
    device together): with a pipeline, its stages' (summed over the stages the rank runs)."""
    m, p = plan["memory"], plan["pipeline"]
    whole = {k: m["host"][k] + m["device"][k] for k in KINDS}
    if p is None:
        return [whole] * plan["world_size"]
    out = []
    for r in plan["ranks"]:
        mine = [s for s in p["stages"] if s["index"] % p["ranks"] == r["coords"]["pp"]]
        out.append({k: sum(s["bytes"][k] for s in mine) for k in KINDS})
    return out


def held_as_planned(row: dict, slack: float = 0.05) -> bool:
    """Every rank holds the parameters, optimizer states and tables the plan says, within ``slack`` (FSDP2 pads a
    shard to equal sizes; DeepSpeed pads its flat partitions)."""
    return all(abs(h[k] - p[k]) <= slack * max(p[k], 1) + 64 for h, p in zip(row["held"], row["planned"])
               for k in KINDS)


def data_parallel_of(plan: dict) -> str:
    from launcher.parallel import DATA_PARALLEL

    return next(p["name"] for p in plan["parts"] if p["name"] in DATA_PARALLEL)


def table(result: dict) -> str:
    lines = ["| combination | parts | losses (step 1 → last) | worst rel. Δloss vs 1 process | allowed | holds what "
             "the plan says | eval |", "|---|---|---|---:|---:|---|---|"]
    for r in result["rows"]:
        if r["status"] == "refused":
            lines.append(f"| {r['key']} | refused: {' '.join(r['why'])} | | | | | |")
            continue
        ev = r["eval"] or {}
        shown = ", ".join(f"{m} {ev[m]:.3f}" for m in ("loss", "auc") if m in ev)
        if r.get("reference_eval"):
            shown += f" (1 process: loss {r['reference_eval']['loss']:.3f})"
        mib = max(h["params"] + h["optimizer"] + h["tables"] for h in r["held"]) / 2**10
        holds = f"yes ({mib:.0f} KiB/rank)" if held_as_planned(r) else "NO"
        lines.append(f"| {r['key']} | {r['parts']} | {r['losses'][0]:.4f} → {r['losses'][-1]:.4f} | "
                     f"{r['worst']:.1e} | {r['tolerance']:.0e} | {holds} | {shown} |")
    trained = sum(r["status"] == "trained" for r in result["rows"])
    within = sum(r["status"] == "trained" and r["worst"] <= r["tolerance"] for r in result["rows"])
    holding = sum(r["status"] == "trained" and held_as_planned(r) for r in result["rows"])
    lines.append(f"\n{len(result['rows'])} combinations: {trained} plan and train ({within} within their tolerance "
                 f"of one process, {holding} with every rank holding the bytes its plan estimates), "
                 f"{len(result['refused'])} refused; {result['steps']} steps each, {result['seconds']} s to train "
                 f"them all")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["gpt", "wide_deep"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--triples", action="store_true", help="every triple of intents instead of each alone and pairs")
    ap.add_argument("--json", type=Path, default=None, help="default: bench/results/matrix.json (matrix3.json)")
    args = ap.parse_args()
    args.json = args.json or ROOT / "bench" / "results" / ("matrix3.json" if args.triples else "matrix.json")
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.recipes, args.steps, Path(tmp), combos=combinations(3 if args.triples else 2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(table(result))


if __name__ == "__main__":
    main()
