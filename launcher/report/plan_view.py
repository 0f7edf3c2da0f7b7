"""The plan as a rich tree (a script= run's as a few lines), for dry runs and the start of every run: compact by
default (launcher/report/plan_compact.py), whole with output.full_plan=true and always in the run dir's plan.txt."""

from __future__ import annotations

import json

from rich.console import RenderableType
from rich.json import JSON
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from launcher.report.memory_view import memory_tree, terms_table
from launcher.report.plan_compact import compact_plan_view
from launcher.errors import printable
from launcher.plan import Bytes, LaunchPlan, ScriptPlan
from launcher.plan.placement import TablePlan, twin_words
from launcher.plan.ps import rows_per_rank
from launcher.plan.registry import table_state_bytes
from launcher.plan.sharding import ShardingPlan, shapes_words, strategy_words
from launcher.terminal import plain_text
from launcher.units import gb

PLAN_TEXT_WIDTH = 120
"""Columns of the run dir's plan.txt (its tables as wide as their rows)."""


def plan_views(plan: LaunchPlan | ScriptPlan, full: bool, dry_run: bool, width: int) -> list[RenderableType]:
    """What the console shows of a plan at ``width`` columns: the compact view, or (``full``) the whole tree and its
    tables, with every memory term in a dry run. A script= run's plan is a few lines either way."""
    if plan.kind == "script":
        return [script_plan_view(plan)]
    if not full:
        return compact_plan_view(plan, width)
    terms = [terms_table(plan.peak)] if dry_run and plan.peak is not None else []
    return [plan_tree(plan), placement_table(plan), *terms]


def plan_text(plan: LaunchPlan | ScriptPlan) -> str:
    """The whole plan as plain text, for the run dir's plan.txt: the tree, the placement and every memory term."""
    if plan.kind == "script":
        return plain_text([script_plan_view(plan)], PLAN_TEXT_WIDTH)
    terms = [terms_table(plan.peak, every=True)] if plan.peak is not None else []
    return plain_text([plan_tree(plan), placement_table(plan), *terms], PLAN_TEXT_WIDTH)


def engine_config_view(config: dict, full: bool) -> RenderableType:
    """The DeepSpeed config a dry run shows: indented JSON (``full``), or one line per top-level key."""
    if full:
        return JSON(json.dumps(config))
    lines = [f'  "{k}": {json.dumps(v)}' + ("," if n < len(config) else "")
             for n, (k, v) in enumerate(config.items(), 1)]
    return Text("\n".join(["{", *lines, "}"]))


def _shown(name: object) -> str:
    """A name from the user's model or data (a table, a layer, a script's argument) as rich shows it: control
    characters as escapes (never obeyed by the terminal), brackets as text (never read as markup)."""
    return escape(printable(str(name)))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def script_plan_view(plan: ScriptPlan) -> Text:
    """A script= run's plan: the ranks, what runtime.prepare() builds if the script calls it, the notes."""
    rt, uses = plan.runtime, plan.uses or {}
    parts = "+".join(p["name"] for p in rt["parts"])
    builds = (f"{parts}, ZeRO {rt['zero_stage']}, {rt['precision']}, optimizer on "
              f"{rt['placement']['optimizer_location']}")
    if uses.get("kind") == "accelerate":
        who = "HF Trainer (on accelerate)" if uses.get("trainer") else "accelerate"
        what = Text(f"{who}: {printable(uses['why'])}; Accelerator() gets {builds} through accelerate launch's "
                    f"environment ({', '.join(uses.get('handover', ()))})")
    else:
        ps = f"placement.ps=true (every table's rows split over the {plan.world_size} ranks), " if rt.get("ps") else ""
        what = Text(f"if the script calls runtime.prepare(), it builds: {builds}; tables: "
                    f"host_device_mix={rt['host_device_mix']}, {ps}placement.tables {rt['table_locations'] or '-'}")
    return Text("\n").join([
        Text.from_markup(f"[bold]plan[/bold]: script {_shown(plan.script)} {_shown(' '.join(plan.args))} on "
                         f"{plan.world_size} rank(s), {plan.device_type}, torchrun environment"),
        what,
        *(Text(f"not applied: {printable(n['key'])}={printable(n['value'])}: {n['why']}") for n in plan.not_applied),
        *(Text(f"note: {printable(note)}") for note in plan.notes),
    ])


def partition_words(t: TablePlan, ranks_per_host: int | None) -> str:
    """How a table outside the parts is spread over the ranks, with its bytes per rank and per host (weights and its
    optimizer's states): 'ps: rows split over 4 ranks, 250,000 rows = 16.0 MB (+ states 32.0 MB) per rank, 96.0 MB
    per host', or 'a copy per rank: ...'. ``ranks_per_host``: None with a pipeline (which of a host's ranks hold the
    table's stage depends on the mesh)."""
    rows = rows_per_rank(t)
    weights = rows * t.dim * 4
    states = table_state_bytes(t.optimizer, rows, t.dim)
    per_rank = f"{gb(weights)} (+ states {gb(states)}) per rank{'' if ranks_per_host else ' of its stage'}"
    host = f", {gb(ranks_per_host * (weights + states))} per host" if ranks_per_host else ""
    if t.sharded:
        return f"ps: rows split over {t.shards} ranks, {rows:,} rows = {per_rank}{host}"
    return f"a copy per rank: {per_rank}{host}"


def placement_table(plan: LaunchPlan) -> Table:
    """One row per table and for the dense network: where it lives, how its rows are spread over the ranks (bytes
    per rank and per host), its optimizer, where that optimizer's state is."""
    pl, o = plan.placement, plan.optimizer
    t = Table(title="placement", title_justify="left")
    for col in ("table / module", "size", "lives on", "partition", "optimizer", "its state on"):
        t.add_column(col, overflow="fold")  # a long module path wraps, never ends in …
    per_host = plan.nproc_per_node if plan.pipeline is None else None
    for tb in pl.tables:
        name = f"{_shown(tb.alias)} ({_shown(tb.name)})" if tb.alias else _shown(tb.name)
        size = f"{tb.rows:,}×{tb.dim}" + (f"; raw ids hashed into {tb.hash_buckets:,} rows ({tb.hash_fn})"
                                          if tb.hash_buckets else "")
        if not tb.outside:
            t.add_row(name, size, "device, with the model", "as the parts split it", f"{o.name} dense",
                      pl.optimizer_location)
        else:
            twin = twin_words(tb)  # how it relates to the dense optimizer whose settings it took
            t.add_row(name, size, tb.location + (" (ps)" if tb.sharded else ""),
                      partition_words(tb, per_host), f"{tb.optimizer} rows{f' ({twin})' if twin else ''}",
                      tb.location)
    for mp in pl.modules:  # placement.modules (launcher/plan/host_modules.py)
        t.add_row(_shown(mp.name), f"{mp.params:,}", "host: its forward and backward run on the host CPU",
                  f"a copy per rank: {mp.bytes / 1e6:,.1f} MB (weights, gradients, optimizer states)",
                  f"{o.name} (torch, on the host)", "host")
    impl = f" ({pl.cpu_impl})" if pl.optimizer_location == "host" else ""
    t.add_row("dense network", f"{pl.dense_params:,}", f"{pl.param_location}, {plan.engine}, ZeRO-{plan.zero_stage}",
              "", f"{o.name}{impl}", pl.optimizer_location)
    return t


def sharding_table(sh: ShardingPlan) -> Table:
    """One row per operator: strategy (MindSpore's notation), global shapes, one rank's local shapes, collectives."""
    how = f"{sh.source}, {sh.search_mode}" if sh.search_mode else sh.source
    t = Table(title=f"sharding ({how}; dp {sh.dp} × tp {sh.tp}; w as (in, out))", title_justify="left")
    for col in ("operator", "strategy", "global shapes", "local shapes (per rank)", "collectives inserted"):
        t.add_column(col, overflow="fold")  # a narrow terminal or a CI log wraps cells, never cuts them
    for op in sh.ops:
        t.add_row(f"{op.name} ({op.alias})", strategy_words(op), shapes_words(op.global_shapes),
                  shapes_words(op.local_shapes, op.partial), "; ".join(op.collectives) or "none")
    return t


def _bytes_line(where: str, b: Bytes, ranks: int) -> str:
    gathered = f" + gathered during a step {_mib(b.gathered)}" if b.gathered else ""
    return (f"{where}: {_mib(b.total)}/rank, {_mib(b.total * ranks)}/host = params {_mib(b.params)} + grads "
            f"{_mib(b.grads)} + optimizer {_mib(b.optimizer)} + tables {_mib(b.tables)} + table states "
            f"{_mib(b.table_states)}{gathered}")


def pipeline_tree(plan: LaunchPlan) -> Tree:
    """Each stage: its layers, parameters and estimated memory; the schedule's bubble."""
    p = plan.pipeline
    stages = len(p.stages)
    v = p.stages_per_rank
    per_rank = f" ({v} per rank)" if v > 1 else ""
    t = Tree(f"pipeline: {stages} stages{per_rank} ({p.partition}), {p.micro_batches} micro-batches per step, "
             f"{p.schedule}; bubble (P-1)/(V·M+P-1) = {p.ranks - 1}/{v * p.micro_batches + p.ranks - 1} = "
             f"{p.bubble:.1%}; losses from stage {stages - 1}")
    for s in p.stages:
        act = f" + activations {_mib(s.activation_bytes)} ({s.in_flight} in flight)" if s.activation_bytes is not None \
            else ""
        ranks = [r.rank for r in plan.ranks if r.coords["pp"] == p.rank_of(s.index)]
        t.add(f"stage {s.index} (rank {', '.join(map(str, ranks))}): {_shown(', '.join(s.layers))}; {s.params:,} "
              f"parameters; {_mib(s.state_bytes)} params+grads+optimizer+tables{act}")
    for tie in p.tied:
        t.add(f"shared weight {_shown(' = '.join(tie.paths))} ({tie.numel:,}) on stages "
              f"{', '.join(map(str, tie.stages))}: gradients summed over them before each step")
    return t


def _value(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def parts_tree(plan: LaunchPlan) -> Tree:
    """The parallel parts in the order a rank applies them, each with the mesh dims it uses, why, and its config."""
    t = Tree(f"parts, in the order they apply (ZeRO stage {plan.zero_stage}):")
    for n, part in enumerate(plan.parts, 1):
        dims = " × ".join(f"{d} {getattr(plan.dims, d)}" for d in part.dims) or "no mesh dim"
        node = t.add(escape(f"{n}. {part.name} on {dims}: {part.why}"))
        for key, value in part.config.items():
            node.add(escape(f"{key}: {_value(value)}"))
    return t


def plan_tree(plan: LaunchPlan) -> Tree:
    b, o, m, d = plan.batch, plan.optimizer, plan.memory, plan.dims
    root = Tree(f"[bold]plan[/bold]: recipe {plan.recipe}, {plan.world_size} rank(s) on {plan.device_type}")
    par = root.add("parallel")
    par.add(f"nnodes {plan.nnodes} × nproc_per_node {plan.nproc_per_node} = world {plan.world_size}")
    par.add(f"mesh {' × '.join(f'{n} {getattr(d, n)}' for n in d.names)}, backend {plan.backend}")
    par.add(parts_tree(plan))
    root.add(f"batch: global {b.global_size} = micro {b.micro_size} × accum {b.grad_accum} × dp {d.dp}")
    if plan.pipeline is not None:
        root.add(pipeline_tree(plan))
    root.add(f"trainer: {plan.steps} steps, log every {plan.log_every}, seed {plan.seed}, precision {plan.precision}")
    root.add(f"optimizer: {o.name} lr {o.lr} on {plan.placement.optimizer_location}")
    if plan.placement.sparse_tables and plan.placement.prefetch_words:
        root.add(escape(f"table lookups: {plan.placement.prefetch_words}"))
    if plan.placement.kernels_words:
        root.add(escape(f"table kernels: {plan.placement.kernels_words}"))
    per_rank = "; per rank: the largest stage's" if plan.pipeline is not None else ""
    mem = memory_tree(plan) if plan.peak is not None else Tree("memory")
    root.children.append(mem)  # a node of the tree (root.add would make the tree a label, its lines apart)
    states = mem.add(f"states ({m.params:,} parameters, {m.dense_params:,} trained by the parts{per_rank})")
    states.add(_bytes_line("host", m.host, plan.nproc_per_node))
    states.add(_bytes_line("device", m.device, plan.nproc_per_node))
    if plan.activations:
        a = plan.activations
        recomputed = (f"; with recompute of {_shown(', '.join(plan.recompute))}: {_mib(a['kept_bytes_with_recompute'])}"
                      if plan.recompute else "")
        act = mem.add(f"activations kept for the backward, per micro-batch: {_mib(a['kept_bytes'])}{recomputed}")
        act.add(", ".join(f"{_shown(n)} {_mib(v)}" for n, v in a["per_layer"].items()))
    ranks = root.add("ranks")
    for r in plan.ranks:
        coords = " ".join(f"{k} {v}" for k, v in r.coords.items())
        ranks.add(f"rank {r.rank}: ({coords}), node {r.node_rank}, local rank {r.local_rank}, device {r.device}, "
                  f"OMP_NUM_THREADS {r.env['OMP_NUM_THREADS']}")
    if plan.sharding is not None:
        root.add(sharding_table(plan.sharding))
    if plan.reference:
        root.add("data reference: " + ", ".join(f"{k} {v:.4f}" for k, v in plan.reference.items()))
    if plan.ds_ops:
        root.add(f"DeepSpeed ops: {', '.join(plan.ds_ops)}")
    for note in plan.notes:
        root.add(f"[dim]note: {_shown(note)}[/dim]")
    return root
