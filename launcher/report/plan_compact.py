"""The plan in about 40 lines, what a dry run and the start of a run print by default: the decisions a user makes
(world and mesh, the parts, batch, trainer, optimizer, where each table and the dense network live, memory per rank
and per host against the budgets) and every note, one line each, cut with … at the terminal's width. The whole tree
and every table (plan_view.plan_tree, placement_table, memory_view.terms_table) are in the run dir's plan.txt, and
printed with output.full_plan=true."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from rich.tree import Tree

from launcher.errors import printable
from launcher.plan import LaunchPlan
from launcher.plan.placement import TablePlan, twin_words
from launcher.plan.ps import rows_per_rank
from launcher.plan.registry import table_state_bytes
from launcher.plan.sharding import ShardingPlan, shapes_words, strategy_words
from launcher.report.memory_view import compact_memory_tree
from launcher.terminal import one_line, one_line_table
from launcher.units import gb

FULL_PLAN = ("the whole plan: output.full_plan=true, or plan.txt in the run dir (each part's config, every memory "
             "term, every rank, each line whole)")
"""The compact view's last line: where what it leaves out is."""

SHOWN_STAGES = 8
"""Pipeline stages listed one line each; the rest are counted in one line (plan.txt lists every stage)."""


def compact_plan_view(plan: LaunchPlan, width: int) -> list[RenderableType]:
    """The compact view at ``width`` columns: the tree, the placement (one row per table and for the dense network),
    the operators' sharding when the run has it, and where the whole plan is."""
    views: list[RenderableType] = [compact_tree(plan), compact_placement_table(plan, width)]
    if plan.sharding is not None:
        views.append(compact_sharding_table(plan.sharding, width))
    views.append(Group(one_line(FULL_PLAN, style="dim")))  # a Group: the console joins bare Texts, wrapping them
    return views


def compact_tree(plan: LaunchPlan) -> Tree:
    b, o, d = plan.batch, plan.optimizer, plan.dims
    root = Tree(Text.assemble(("plan", "bold"), f": recipe {printable(plan.recipe)}, {plan.world_size} rank(s) on "
                                                f"{plan.device_type}"))
    root.add(one_line(f"world {plan.world_size} = nnodes {plan.nnodes} × nproc_per_node {plan.nproc_per_node}; mesh "
                      f"{' × '.join(f'{n} {getattr(d, n)}' for n in d.names)}, backend {plan.backend}"))
    parts = root.add(f"parts, in the order they apply (ZeRO stage {plan.zero_stage}):")
    for n, part in enumerate(plan.parts, 1):
        dims = " × ".join(f"{dim} {getattr(d, dim)}" for dim in part.dims) or "no mesh dim"
        parts.add(one_line(f"{n}. {part.name} on {dims}: {printable(part.why)}"))
    root.add(one_line(f"batch: global {b.global_size} = micro {b.micro_size} × accum {b.grad_accum} × dp {d.dp}"))
    if plan.pipeline is not None:
        root.children.append(_pipeline(plan))
    root.add(one_line(f"trainer: {plan.steps} steps, log every {plan.log_every}, seed {plan.seed}, precision "
                      f"{plan.precision}"))
    root.add(one_line(f"optimizer: {o.name} lr {o.lr} on {plan.placement.optimizer_location}"))
    if plan.placement.sparse_tables and plan.placement.prefetch_words:
        root.add(one_line(f"table lookups: {plan.placement.prefetch_words}"))
    if plan.placement.kernels_words:
        root.add(one_line(f"table kernels: {plan.placement.kernels_words}"))
    root.children.append(compact_memory_tree(plan) if plan.peak is not None else _states(plan))
    root.add(one_line(_ranks(plan)))
    if plan.reference:
        root.add(one_line("data reference: " + ", ".join(f"{k} {v:.4f}" for k, v in plan.reference.items())))
    if plan.ds_ops:
        root.add(one_line(f"DeepSpeed ops: {', '.join(plan.ds_ops)}"))
    for note in plan.notes:  # every note, each on one line: a note is how the plan says what it changed
        root.add(one_line(f"note: {printable(note)}", style="dim"))
    return root


def _pipeline(plan: LaunchPlan) -> Tree:
    """The schedule on one line, then each stage's figures before its layers, and each shared weight."""
    p = plan.pipeline
    per_rank = f" ({p.stages_per_rank} per rank)" if p.stages_per_rank > 1 else ""
    t = Tree(one_line(f"pipeline: {len(p.stages)} stages{per_rank} ({p.partition}), {p.micro_batches} micro-batches, "
                      f"{p.schedule}, bubble {p.bubble:.1%}, losses from stage {len(p.stages) - 1}"))
    for s in p.stages[:SHOWN_STAGES]:
        act = (f" + {gb(s.activation_bytes)} activations ({s.in_flight} in flight)" if s.activation_bytes is not None
               else "")
        ranks = ", ".join(str(r.rank) for r in plan.ranks if r.coords["pp"] == p.rank_of(s.index))
        t.add(one_line(f"stage {s.index} (rank {ranks}): {s.params:,} params, {gb(s.state_bytes)} states{act}: "
                       f"{printable(', '.join(s.layers))}"))
    if len(p.stages) > SHOWN_STAGES:
        t.add(one_line(f"{len(p.stages) - SHOWN_STAGES} more stages (plan.txt lists each)"))
    for tie in p.tied:
        t.add(one_line(f"shared weight {printable(' = '.join(tie.paths))} on stages "
                       f"{', '.join(map(str, tie.stages))}: gradients summed over them before each step"))
    return t


def _states(plan: LaunchPlan) -> Tree:
    """Memory without the planner's model of the peak: the states per rank, host and device."""
    m = plan.memory
    t = Tree(one_line(f"memory: states of {m.params:,} parameters ({m.dense_params:,} trained by the parts)"))
    for where, b in (("host", m.host), ("device", m.device)):
        t.add(one_line(f"{where}: {gb(b.total)}/rank, {gb(b.total * plan.nproc_per_node)}/host"))
    return t


def _ranks(plan: LaunchPlan) -> str:
    threads = sorted({r.env.get("OMP_NUM_THREADS", "?") for r in plan.ranks})
    ranks = ", ".join(f"{r.rank} ({' '.join(f'{k} {v}' for k, v in r.coords.items())}) node {r.node_rank} {r.device}"
                      for r in plan.ranks)
    return f"ranks (OMP_NUM_THREADS {'/'.join(threads)}): {ranks}"


PLACEMENT_COLUMNS = ("table / module", "size", "lives on", "per rank", "per host", "optimizer")


def compact_placement_table(plan: LaunchPlan, width: int) -> Group:
    """placement_table with one line per row at ``width`` columns: bytes per rank and per host as numbers, the
    optimizer's state named only where it is not with its weights. When narrow, the per-host bytes go first, then
    the sizes; then a long name, place or optimizer is cut with …."""
    pl, o, m = plan.placement, plan.optimizer, plan.memory
    per_host = plan.nproc_per_node if plan.pipeline is None else 0
    rows = [_table_row(t, o.name, per_host) for t in pl.tables]
    dense = sum(b.params + b.grads + b.optimizer for b in (m.host, m.device))
    optimizer = o.name + (f" ({pl.cpu_impl})" if pl.optimizer_location == "host" else "")
    if pl.optimizer_location != pl.param_location:
        optimizer += f", state on {pl.optimizer_location}"
    for mp in pl.modules:  # placement.modules: on the host, with their own optimizer there
        dense -= mp.bytes
        rows.append([printable(mp.name), f"{mp.params:,}", "host (runs on the CPU)", gb(mp.bytes),
                     gb(mp.bytes * per_host) if per_host else "", f"{o.name}, on host"])
    rows.append(["dense network", f"{pl.dense_params:,}", pl.param_location, gb(dense),
                 gb(dense * per_host) if per_host else "", optimizer])
    title = "placement (bytes: weights (+ optimizer states))"
    if not per_host:  # which of a host's ranks hold a stage depends on the mesh
        rows = [r[:4] + r[5:] for r in rows]
        return one_line_table(f"{title}, per rank of the stage that holds it", PLACEMENT_COLUMNS[:4] +
                              PLACEMENT_COLUMNS[5:], rows, width, shrink=(0, 2, 4), optional=(1,))
    return one_line_table(title, PLACEMENT_COLUMNS, rows, width, shrink=(0, 2, 5), optional=(4, 1))


def _table_row(t: TablePlan, dense_optimizer: str, per_host: int) -> list[str]:
    name = f"{printable(t.alias)} ({printable(t.name)})" if t.alias else printable(t.name)
    size = f"{t.rows:,}×{t.dim}" + (", hashed" if t.hash_buckets else "")
    if not t.outside:
        return [name, size, "device, in the parts", "as the parts split it", "", f"{dense_optimizer} dense"]
    rows = rows_per_rank(t)
    weights, states = rows * t.dim * 4, table_state_bytes(t.optimizer, rows, t.dim)
    where = t.location + (f", ps over {t.shards}" if t.sharded else "")
    twin = twin_words(t)
    return [name, size, where, f"{gb(weights)} (+ {gb(states)})", gb(per_host * (weights + states)) if per_host else "",
            f"{t.optimizer} rows" + (f" ({twin})" if twin else "")]


def compact_sharding_table(sh: ShardingPlan, width: int) -> Group:
    """sharding_table with one line per operator: its strategy, one rank's shapes and (where the width allows) the
    collectives, cut with …."""
    how = f"{sh.source}, {sh.search_mode}" if sh.search_mode else sh.source
    rows = [[f"{printable(op.name)} ({op.alias})", strategy_words(op), shapes_words(op.local_shapes, op.partial),
             "; ".join(op.collectives) or "none"] for op in sh.ops]
    return one_line_table(f"sharding ({how}; dp {sh.dp} × tp {sh.tp}; w as (in, out))",
                          ("operator", "strategy", "local shapes (per rank)", "collectives inserted"), rows, width,
                          shrink=(0, 2, 3), optional=(3,))
