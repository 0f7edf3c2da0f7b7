"""placement=auto's inputs from a drafted plan: the budgets, the layouts to try, how one is evaluated by the parts'
rules, the step-time model's figures (the search itself is launcher/plan/auto.py)."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from launcher.plan.auto import AutoResult, Sharding, choose, dense_layouts, owned_terms
from launcher.plan.budget import budget_of
from launcher.plan.cost import CostInput
from launcher.plan.host_modules import ModulePlan, composition_problems, named
from launcher.plain import to_plain
from launcher.plan.memory import state_floats
from launcher.plan.peak import MemoryInput, table_terms
from launcher.plan.ps import shardable
from launcher.plan.registry import TABLE_OPTIMIZERS


def search(cfg: DictConfig, host, facts, placement, intents, sizes, nproc: int) -> AutoResult:
    """The best layout for the drafted plan (its placement and intents as the user's keys made them)."""

    budget = budget_of(cfg.cluster.device_memory_gb, cfg.cluster.host_memory_gb, cfg.placement.reserve,
                       host.host_memory, host.device_memory, intents.device_type, nproc)
    outside = [t for t in placement.tables if t.outside]
    fixed = _fixed_tables(cfg, placement)
    on_device = dataclasses.replace(placement, tables=tuple(  # the tables you placed stay where you placed them
        dataclasses.replace(t, location="device") if t.outside and t.name not in fixed else t
        for t in placement.tables))
    rules = facts.parts
    mm = rules.model_memory(sizes, facts, nproc)
    names = {t.name for t in outside}
    layers = tuple(n for n in sizes.layers if n not in names)

    seen: set[tuple] = set()
    tables = tuple(table_terms(MemoryInput(estimate=None, device_type=intents.device_type, nproc_per_node=nproc,
                                           micro_size=intents.batch[1], grad_accum=intents.batch[2],
                                           tables=on_device.tables, lookups=mm.lookups)))

    def evaluate(zero: int, opt: bool, par: bool, rec: tuple[str, ...], hosted: tuple = ()):
        i = dataclasses.replace(intents, zero=zero, offload_optimizer=opt, offload_params=par, recompute=rec)
        parts, problems, _ = rules.plan_parts(i)
        if problems or not parts:
            return None
        run = rules.run_facts(i, parts)
        where = dataclasses.replace(on_device, param_location=run.param_location,
                                    optimizer_location=run.optimizer_location)
        where = _hosted(where, hosted, state_floats(intents.optimizer))
        key = (run.zero, opt, par, rec, tuple(n for n, _, _ in hosted))
        if key in seen:  # ZeRO-0 with offload runs as ZeRO-2: the same layout twice
            return None
        seen.add(key)
        terms = None if intents.dims.pp > 1 else tables
        return rules.rank_memory(i, parts, where, mm, terms)[2], run.data_parallel, run.step_overhead_s, run.zero

    dense = max(0, placement.dense_params) // max(1, intents.dims.pp * intents.dims.tp)
    lookups = dict(facts.lookups or {})
    group = intents.dims.world_size // intents.dims.pp
    cost = CostInput(device_type=intents.device_type, dense_params=dense, dp=intents.dims.dp,
                     nnodes=max(1, cfg.cluster.nnodes), samples=intents.batch[1] * intents.batch[2],
                     state_floats=state_floats(intents.optimizer),
                     tables=tuple((t.name, t.dim, lookups.get(t.name, 1.0), TABLE_OPTIMIZERS[t.optimizer].state_floats)
                                  for t in outside), group=group)
    if cfg.recompute:
        recomputes = [intents.recompute]  # the user's set
    else:
        recomputes = [(), layers] if facts.activations is not None and layers else [()]
    layouts = [lay for lay in dense_layouts(intents.dims.dp, recomputes) if _kept(lay, cfg, intents)]
    owned = owned_terms(tables) if intents.dims.pp == 1 else {}  # a pipeline's tables are its stages' totals
    sharding = _sharding(cfg, outside, owned, group, MemoryInput(
        estimate=None, device_type=intents.device_type, nproc_per_node=nproc, micro_size=intents.batch[1],
        grad_accum=intents.batch[2], lookups=mm.lookups))
    owned = {n: ts for n, ts in owned.items() if n not in fixed}
    movable = [(t.name, t.rows) for t in outside if t.name not in fixed]
    return choose(evaluate, layouts, movable, budget, cost, owned, fixed, sharding, _modules(cfg, sizes))


def _hosted(where, hosted: tuple, state_floats: int):
    """The placement with the dense modules ``hosted`` ((name, parameters, io floats) each) on the host, beside the
    ones you placed: out of what the parts train."""
    if not hosted:
        return where
    return dataclasses.replace(where, modules=where.modules + tuple(ModulePlan(n, p, state_floats, io)
                                                                    for n, p, io in hosted),
                               dense_params=max(0, where.dense_params - sum(p for _, p, _ in hosted)))


def _modules(cfg: DictConfig, sizes) -> tuple[tuple[str, int, int], ...]:
    """The dense modules auto may put on the host, largest first: (name, parameters, input + output floats per
    sample) of each module with parameters that holds no other such module (the model's layers of weights), but
    those you placed with placement.modules (kept where you put them) and what is inside or around them; none when
    the run's keys cannot run host modules (launcher/plan/host_modules.py composition_problems)."""
    if not sizes.modules or composition_problems((ModulePlan("x", 1),), cfg):
        return ()
    yours = [m for k in cfg.placement.modules for m in named(k, sizes.modules)]
    leaves = [m for m in sizes.modules if not any(o.startswith(m + ".") for o in sizes.modules)
              and not any(m == y or m.startswith(y + ".") or y.startswith(m + ".") for y in yours)]
    return tuple(sorted(((m, sizes.modules[m], sum(sizes.module_io.get(m, (0, 0)))) for m in leaves),
                        key=lambda t: (-t[1], t[0])))


def _sharding(cfg: DictConfig, outside: list, owned: dict, group: int, m: MemoryInput) -> Sharding | None:
    """The tables auto may split over the ``group`` ranks (parameter-server mode) and their terms split: those with
    no placement.tables entry whose optimizer's state splits with the rows (not sparse_adam), not split already.
    None with one rank to a group, or with a pipeline (its tables are its stages' totals, not terms of their own)."""
    named = to_plain(cfg.placement.tables, resolve=False)
    can = [t for t in outside if t.name not in named and shardable(t)]
    if group <= 1 or not owned or not can:
        return None

    def build():
        split = tuple(dataclasses.replace(t, location="host", shards=group) for t in can)
        terms = owned_terms(tuple(table_terms(dataclasses.replace(m, tables=split))))
        whole = {t.name: sum(x.bytes for x in owned.get(t.name, ()) if x.phase == "always") for t in can}
        return tuple(sorted(whole, key=lambda n: (-whole[n], n))), terms, whole

    return Sharding(group=group, build=build)


def _kept(layout: tuple, cfg: DictConfig, intents) -> bool:
    """Whether a layout keeps what the user set: auto chooses only the keys left at their defaults (zero.stage 0,
    optimizer.target device, placement.offload_params false, recompute [])."""
    zero, opt, par, rec = layout
    return ((cfg.zero.stage == 0 or zero == cfg.zero.stage) and (not intents.offload_optimizer or opt)
            and (not intents.offload_params or par))


def _fixed_tables(cfg: DictConfig, placement) -> dict[str, str]:
    """Tables whose place the user set (placement.tables.<name>, or every table with host_device_mix=1 or
    placement.ps=true): name -> host, device or ps (its rows split over the ranks)."""
    named = to_plain(cfg.placement.tables, resolve=False)
    pl = cfg.placement
    return {t.name: "ps" if t.sharded else t.location for t in placement.tables
            if t.outside and (t.name in named or pl.host_device_mix == 1 or pl.ps)}
