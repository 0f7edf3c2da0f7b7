"""``placement=auto`` (pure): the placement that fits every device and host at the least estimated step time.

The search: each dense layout (ZeRO stage, the optimizer and the parameters on the host or not, recompute of every
layer or none) that the parts can run is planned by the parts' own rules (launcher/parallel: its data-parallel part,
its memory and buffers); then, starting from every table on the device, tables move to the host, those with the most
rows first (the fewest looked-up bytes per byte freed), until the device fits. A candidate fits when every device
and every host holds its peak within the budget (launcher/plan/budget.py); the chosen one is the fastest by the
step-time model (launcher/plan/cost.py), ties to the one that changes least. What it chose becomes ordinary keys
(zero.stage, optimizer.target, placement.offload_params, placement.tables.<name>, recompute), which the plan then
plans as if the user had written them; each decision is said with its reason and the runner-up.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from launcher.plan.budget import Budget, fits, gb, overs, ranks_that_fit, shortfall
from launcher.plan.cost import step_time
from launcher.plan.peak import PHASES, MemoryPlan, Term


MARGIN = 0.05
"""Layouts whose estimated step times differ by less than this are taken as equal: the one that changes the least
of the user's keys wins (the step-time model ranks; it does not promise 5 %)."""


@dataclass(frozen=True)
class Candidate:
    zero: int
    offload_optimizer: bool
    offload_params: bool
    recompute: tuple[str, ...]
    host_tables: tuple[str, ...]
    memory: MemoryPlan
    seconds: float
    data_parallel: str

    @property
    def changes(self) -> int:
        return (self.zero > 0) + self.offload_optimizer + self.offload_params + bool(self.recompute)

    def words(self) -> str:
        where = "host" if self.offload_optimizer else "device"
        params = ", parameters on the host" if self.offload_params else ""
        rec = "recompute all" if self.recompute else "no recompute"
        return f"zero.stage={self.zero} ({self.data_parallel}), optimizer on the {where}{params}, {rec}"

    def overrides(self, tables: tuple[str, ...]) -> dict[str, Any]:
        host = set(self.host_tables)
        return {"zero.stage": self.zero, "optimizer.target": "CPU" if self.offload_optimizer else "device",
                "placement.offload_params": self.offload_params, "recompute": list(self.recompute),
                "placement.tables": {t: "host" if t in host else "device" for t in tables}}


@dataclass(frozen=True)
class AutoResult:
    chosen: Candidate | None
    overrides: dict[str, Any]
    decisions: tuple[str, ...]
    problems: tuple[str, ...]
    considered: int


def dense_layouts(dp: int, recomputes: list[tuple[str, ...]]) -> list[tuple[int, bool, bool, tuple[str, ...]]]:
    """(zero, offload optimizer, offload parameters, recompute) to try, in a fixed order."""
    zeros = (0, 1, 2, 3) if dp > 1 else (0, 3)
    out = []
    for rec in recomputes:
        for z in zeros:
            for opt in (False, True):
                for par in ((False, True) if z == 3 and opt else (False,)):
                    out.append((z, opt, par, rec))
    return out


def owned_terms(terms: tuple[Term, ...]) -> dict[str, list[Term]]:
    """The terms that move with each table (by table name), every table on the device."""
    owned: dict[str, list[Term]] = {}
    for t in terms:
        if _owner(t):
            owned.setdefault(_owner(t), []).append(t)
    return owned


def move_tables(mem: MemoryPlan, b: Budget, movable: list[tuple[str, int]], owned: dict[str, list[Term]]
                ) -> tuple[MemoryPlan, tuple[str, ...]]:
    """Tables moved to the host in ``movable``'s order until the device fits (``movable``: (name, rows), on the device).
    Each move relocates the table's terms (its weight, states and step temporaries); its gradient rows stay on the
    compute device. Linear in the tables: the device's sums are updated per move, not recounted."""
    if not b.device or mem.peak("device") <= b.device_usable:
        return mem, ()
    sums = dict.fromkeys(("always", *PHASES), 0)
    for t in mem.terms:
        if t.where == "device":
            sums[t.phase] += t.bytes
    moved: list[str] = []
    for name, _rows in movable:  # most rows first (the caller's order)
        if sums["always"] + max(sums[p] for p in PHASES) <= b.device_usable:
            break
        for t in owned.get(name, ()):
            sums[t.phase] -= t.bytes
        moved.append(name)
    relocated = {id(t) for name in moved for t in owned.get(name, ())}
    terms = tuple(Term(t.name, "host", t.bytes, t.phase, t.basis, t.source) if id(t) in relocated else t
                  for t in mem.terms)
    return dataclasses.replace(mem, terms=terms), tuple(moved)


OWNED = ("table", "states", "step")
"""The terms of a table that move with it (launcher/plan/peak.py names them '<table> table|states|step')."""


def _owner(t: Term) -> str:
    return _owner_of(t.name)


@functools.lru_cache(maxsize=1 << 16)
def _owner_of(name: str) -> str:
    head, _, tail = name.rpartition(" ")
    return head if tail in OWNED else ""


def _owned(t: Term, table: str) -> bool:
    return _owner(t) == table


def choose(evaluate, layouts, movable, b: Budget, cost_input, owned: dict[str, list[Term]],
           fixed: dict[str, str] | None = None) -> AutoResult:
    """The best fitting candidate. ``evaluate(zero, offload_opt, offload_params, recompute)`` -> (MemoryPlan with
    every movable table on the device, data-parallel part name, seconds its engine adds to a step) or None when the
    parts cannot run it; ``owned``: the terms that move with each table (the same objects in every evaluation);
    ``fixed``: tables the user placed (name -> host|device), kept there."""
    fixed = fixed or {}
    pinned = tuple(n for n, where in fixed.items() if where == "host")
    cands = []
    movable = sorted(movable, key=lambda nr: (-nr[1], nr[0]))  # most rows first: fewest looked-up bytes per byte
    for z, opt, par, rec in layouts:
        got = evaluate(z, opt, par, rec)
        if got is None:
            continue
        mem, dp_name, overhead = got
        mem, host_tables = move_tables(mem, b, movable, owned)
        host_tables = pinned + host_tables
        seconds = step_time(cost_input, z, opt, par, bool(rec), host_tables) + overhead
        cands.append(Candidate(z, opt, par, rec, host_tables, mem, seconds, dp_name))
    ok = sorted((c for c in cands if fits(c.memory, b)), key=lambda c: (c.seconds, c.changes))
    if not ok:
        return AutoResult(None, {}, (), tuple(infeasible(cands, b)), len(cands))
    near = [c for c in ok if c.seconds <= ok[0].seconds * (1 + MARGIN)]  # within the model's error: change least
    best = min(near, key=lambda c: (c.changes, c.seconds))
    ok = [best, *(c for c in ok if c is not best)]
    names = (*fixed, *(n for n, _ in movable))
    return AutoResult(best, best.overrides(names), tuple(explain(best, ok[1:], cands, b, set(fixed))), (), len(cands))


def explain(best: Candidate, others: list[Candidate], cands: list[Candidate], b: Budget,
            fixed: set[str] = frozenset()) -> list[str]:
    """Each decision with its reason and the runner-up."""
    out = [f"dense: {best.words()}: est. step {best.seconds * 1000:.3g} ms, device peak {gb(best.memory.peak('device'))}"
           f", host {gb(best.memory.host_total)}"]
    if others:
        r = others[0]
        out.append(f"runner-up: {r.words()}: est. step {r.seconds * 1000:.3g} ms "
                   f"({(r.seconds / max(best.seconds, 1e-12) - 1):+.0%})")
    refused = sorted((c for c in cands if not fits(c.memory, b) and c.changes < best.changes), key=lambda c: c.seconds)
    if refused:
        out.append(f"not {refused[0].words()}: {shortfall(refused[0].memory, b)}")
    out += _table_reasons(best, b, fixed)
    if fixed:
        out.append(f"kept where you placed them (placement.tables, placement.host_device_mix): "
                   f"{', '.join(sorted(fixed)[:8])}{' ...' if len(fixed) > 8 else ''}")
    return out


def _table_reasons(best: Candidate, b: Budget, fixed: set[str], shown: int = 8) -> list[str]:
    moved = [n for n in best.host_tables if n not in fixed]
    if not moved:
        return []
    mem = best.memory
    at_rest = sum(t.bytes for t in mem.terms if t.where == "device" and t.phase == "always")
    busiest = mem.peak("device") - at_rest
    left = b.device_usable - mem.peak("device")
    out = []
    for name in moved[:shown]:
        size = sum(t.bytes for t in mem.terms if t.phase == "always" and _owned(t, name))
        out.append(f"{name} -> host: on the device it needs {gb(size)} (weights and states); the device budget "
                   f"{gb(b.device_usable)} keeps {gb(at_rest)} at rest and {gb(busiest)} in its busiest phase, so "
                   f"{gb(max(0, left))} is left")
    if len(moved) > shown:
        out.append(f"... and {len(moved) - shown} more tables -> host (plan.json lists them)")
    return out


def infeasible(cands: list[Candidate], b: Budget) -> list[str]:
    """One paragraph: the closest candidate's shortfall and fixes with numbers."""
    if not cands:
        return ["placement=auto: the parallel parts can run no layout with what you set (zero.stage, optimizer.target, "
                "placement.offload_params, recompute, parallel.data_parallel): leave those to auto, or plan without "
                "placement=auto to see the parts' reasons."]
    close = min(cands, key=lambda c: sum(overs(c.memory, b).values()))
    fixes = []
    over = overs(close.memory, b)
    if "host" in over:
        k = ranks_that_fit(close.memory, b)
        per = gb(close.memory.rank_peak)
        one = (close.memory.rank_peak + close.memory.launcher) / (1 - b.reserve)
        fixes.append(f"each rank needs {per} of host memory, so a host holds {k}: run cluster.nproc_per_node={k} on "
                     f"more hosts" if k else f"each rank needs {per} of host memory and the launcher "
                     f"{gb(close.memory.launcher)}: a host of {gb(one)} (cluster.host_memory_gb) runs one rank")
    if "device" in over:
        fixes.append(f"a device of {gb(close.memory.peak('device') / (1 - b.reserve))} "
                     f"(cluster.device_memory_gb), or fewer samples per micro-batch (batch.micro_size)")
    fixes += _fix_words(close)
    return [f"placement=auto: nothing fits. The closest layout ({close.words()}, tables on the host: "
            f"{len(close.host_tables)}) {shortfall(close.memory, b)}. Fixes: {'; '.join(fixes)}."]


def _fix_words(c: Candidate) -> list[str]:
    big = sorted(c.memory.terms, key=lambda t: -t.bytes)[:3]
    return [f"the largest terms are {', '.join(f'{t.name} {gb(t.bytes)} ({t.where})' for t in big)}"]


def override_words(overrides: dict) -> list[str]:
    """The chosen keys in words (a dict of per-table places: how many on the host)."""
    out = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            host = [k for k, v in value.items() if v == "host"]
            out.append(f"{key}: {len(host)} of {len(value)} on the host" if value else f"{key}: none")
        else:
            out.append(f"{key}={value}")
    return out
