"""``placement=auto`` (pure): the placement that fits every device and host at the least estimated step time.

The search: each dense layout (ZeRO stage, the optimizer and the parameters on the host or not, recompute of every
layer or none) that the parts can run is planned by the parts' own rules (launcher/parallel: its data-parallel part,
its memory and buffers); then, starting from every table on the device, tables move to the host, those with the most
rows first (the fewest looked-up bytes per byte freed), until the device fits; when a host then cannot hold a copy
of the host tables per rank, tables are split over the ranks (parameter-server mode, placement.tables.<name>=ps), the
largest first, until it can. A candidate fits when every device and every host holds its peak within the budget
(launcher/plan/budget.py); the chosen one is the fastest by the step-time model (launcher/plan/cost.py), ties to the
one that changes least. What it chose becomes ordinary keys (zero.stage, optimizer.target, placement.offload_params,
placement.tables.<name>, recompute), which the plan then plans as if the user had written them; each decision is
said with its reason and the runner-up."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.plan.budget import Budget, fits, overs, ranks_that_fit, setting, shortfall
from launcher.plan.cost import step_time
from launcher.plan.peak import PHASES, MemoryPlan, host_total_of, phase_sums
from launcher.units import Term, gb


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
    ps_tables: tuple[str, ...] = ()
    """Tables whose rows are split over the ranks (a table moved to the host and then split is here only)."""
    host_modules: tuple[str, ...] = ()
    """Dense modules on the host (placement.modules): tried only when nothing fits without."""
    runs_zero: int = -1
    """The ZeRO stage the parts run it at (a CPU optimizer asked with zero.stage=0 runs ZeRO-2); -1: zero."""

    @property
    def changes(self) -> int:
        dense = (self.zero > 0) + self.offload_optimizer + self.offload_params + bool(self.recompute)
        return dense + bool(self.ps_tables) + bool(self.host_modules)

    def words(self) -> str:
        where = "host" if self.offload_optimizer else "device"
        params = ", parameters on the host" if self.offload_params else ""
        rec = "recompute all" if self.recompute else "no recompute"
        modules = f", {', '.join(self.host_modules)} on the host" if self.host_modules else ""
        stage = self.zero if self.runs_zero < 0 else self.runs_zero
        return f"zero.stage={stage} ({self.data_parallel}), optimizer on the {where}{params}, {rec}{modules}"

    def overrides(self, tables: tuple[str, ...]) -> dict[str, Any]:
        host, ps = set(self.host_tables), set(self.ps_tables)
        modules = {"placement.modules": {m: "host" for m in self.host_modules}} if self.host_modules else {}
        return {"zero.stage": self.zero, "optimizer.target": "CPU" if self.offload_optimizer else "device",
                "placement.offload_params": self.offload_params, "recompute": list(self.recompute),
                "placement.tables": {t: "ps" if t in ps else "host" if t in host else "device" for t in tables},
                **modules}


@dataclass(frozen=True)
class Sharding:
    """What placement=auto may split over the ranks when a host cannot hold a copy of the tables per rank."""

    group: int
    """Ranks a table's rows are split over (world size / pipeline stages)."""
    build: Callable[[], tuple[tuple[str, ...], dict[str, list[Term]], dict[str, int]]]
    """Makes (order, terms, whole) below when first asked: most plans fit with no table split, and counting every
    table's split terms would cost them a tenth of their planning time."""

    @functools.cached_property
    def _built(self) -> tuple[tuple[str, ...], dict[str, list[Term]], dict[str, int]]:
        return self.build()

    @property
    def order(self) -> tuple[str, ...]:
        """The tables it may split, largest first (a copy per rank of the largest costs a host the most)."""
        return self._built[0]

    @property
    def terms(self) -> dict[str, list[Term]]:
        """Each of them split: its block, states, step and exchange on the host (launcher/plan/peak.py)."""
        return self._built[1]

    @property
    def whole(self) -> dict[str, int]:
        """Each one's weights and states as a whole copy on one rank."""
        return self._built[2]


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
    return [(z, opt, par, rec) for rec in recomputes for z in zeros for opt in (False, True)
            for par in ((False, True) if z == 3 and opt else (False,))]


def owned_terms(terms: tuple[Term, ...]) -> dict[str, list[Term]]:
    """The terms that move with each table (by table name), every table on the device."""
    owned: dict[str, list[Term]] = {}
    for t in terms:
        if _owner_of(t.name):
            owned.setdefault(_owner_of(t.name), []).append(t)
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


def shard_tables(mem: MemoryPlan, b: Budget, sharding: Sharding | None) -> tuple[MemoryPlan, tuple[str, ...]]:
    """Tables split over the ranks in ``sharding``'s order until a host fits, each only where splitting it lowers
    the host's total (a whole table on a GPU costs its host nothing). Each split swaps the table's own terms for its
    split ones; the sums are updated per split, not recounted."""
    if sharding is None or not b.host or mem.host_total <= b.host_usable:
        return mem, ()
    index: dict[str, list[int]] = {}
    for i, t in enumerate(mem.terms):
        if _owner_of(t.name) in sharding.terms:
            index.setdefault(_owner_of(t.name), []).append(i)
    sums = phase_sums(mem.terms)

    def host_total() -> int:
        return host_total_of(sums, mem.device_type, mem.nproc_per_node, mem.host_runtime)

    split: list[str] = []
    for name in sharding.order:
        before = host_total()
        if before <= b.host_usable:
            break
        old, new = [mem.terms[i] for i in index.get(name, ())], sharding.terms[name]
        _add(sums, old, -1)
        _add(sums, new, 1)
        if host_total() < before:
            split.append(name)
        else:  # its copy is not in host memory: splitting it would only add the exchange there
            _add(sums, new, -1)
            _add(sums, old, 1)
    dropped = {i for name in split for i in index.get(name, ())}
    terms = (*(t for i, t in enumerate(mem.terms) if i not in dropped), *(t for n in split for t in sharding.terms[n]))
    return dataclasses.replace(mem, terms=terms), tuple(split)


def _add(sums: dict[str, dict[str, int]], terms: list[Term], sign: int) -> None:
    for t in terms:
        sums[t.where][t.phase] += sign * t.bytes


OWNED = ("table", "states", "step", "exchange")
"""The terms of a table that move with it (launcher/plan/peak.py names them '<table> table|states|step|exchange':
exchange, a ps table's received gradient rows, only when its rows are split over the ranks)."""


@functools.lru_cache(maxsize=1 << 16)
def _owner_of(name: str) -> str:
    head, _, tail = name.rpartition(" ")
    return head if tail in OWNED else ""


def choose(evaluate, layouts, movable, b: Budget, cost_input, owned: dict[str, list[Term]],
           fixed: dict[str, str] | None = None, sharding: Sharding | None = None,
           modules: tuple[tuple[str, int, int], ...] = ()) -> AutoResult:
    """The best fitting candidate. ``evaluate(zero, offload_opt, offload_params, recompute, hosted)`` -> (MemoryPlan
    with every movable table on the device, data-parallel part name, seconds its engine adds to a step, the ZeRO
    stage it runs at) or None when the parts cannot run it; ``owned``: the terms that move with each table (the same
    objects in every evaluation); ``fixed``: tables the user placed (name -> host|device|ps), kept there;
    ``sharding``: the tables auto may split over the ranks when a host cannot hold a copy per rank (None: none);
    ``modules``: (name, parameters, input + output floats per sample) of the dense modules auto may put on the host,
    largest first, the k largest tried (k = 1, 2, ...) only when no layout fits without."""
    fixed = fixed or {}
    pinned = tuple(n for n, where in fixed.items() if where == "host")
    pinned_ps = tuple(n for n, where in fixed.items() if where == "ps")
    movable = sorted(movable, key=lambda nr: (-nr[1], nr[0]))  # most rows first: fewest looked-up bytes per byte

    def candidates(hosted: tuple[tuple[str, int, int], ...] = ()) -> list[Candidate]:
        out = []
        ci = dataclasses.replace(cost_input, dense_params=max(0, cost_input.dense_params - sum(m[1] for m in hosted)))
        for z, opt, par, rec in layouts:
            got = evaluate(z, opt, par, rec, hosted)
            if got is None:
                continue
            mem, dp_name, overhead, runs_zero = got
            mem, host_tables = move_tables(mem, b, movable, owned)
            mem, split = shard_tables(mem, b, sharding)
            ps_tables = pinned_ps + split
            host_tables = tuple(n for n in pinned + host_tables if n not in split)
            seconds = overhead + step_time(ci, z, opt, par, bool(rec), host_tables + ps_tables, ps_tables,
                                           tuple((p, io) for _, p, io in hosted))
            out.append(Candidate(z, opt, par, rec, host_tables, mem, seconds, dp_name, ps_tables,
                                 tuple(m[0] for m in hosted), runs_zero))
        return out

    cands = candidates()
    ok = sorted((c for c in cands if fits(c.memory, b)), key=lambda c: (c.seconds, c.changes))
    for k in range(1, len(modules) + 1) if not ok else ():  # after offload, before giving up: dense modules
        more = candidates(modules[:k])
        cands += more
        ok = sorted((c for c in more if fits(c.memory, b)), key=lambda c: (c.seconds, c.changes))
        if ok:
            break
    if not ok:
        return AutoResult(None, {}, (), tuple(infeasible(cands, b, cost_input.group)), len(cands))
    near = [c for c in ok if c.seconds <= ok[0].seconds * (1 + MARGIN)]  # within the model's error: change least
    best = min(near, key=lambda c: (c.changes, c.seconds))
    ok = [best, *(c for c in ok if c is not best)]
    names = (*fixed, *(n for n, _ in movable))
    return AutoResult(best, best.overrides(names), tuple(explain(best, ok[1:], cands, b, set(fixed), sharding)), (),
                      len(cands))


def explain(best: Candidate, others: list[Candidate], cands: list[Candidate], b: Budget,
            fixed: set[str] = frozenset(), sharding: Sharding | None = None) -> list[str]:
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
    if best.host_modules:
        without = [c for c in cands if not c.host_modules]
        closest = min(without, key=lambda c: c.memory.peak("device"), default=None)
        out.append(f"{', '.join(best.host_modules)} -> host (placement.modules): no layout fits with every dense "
                   f"module on the device" + (f" (the closest, {closest.words()}: {shortfall(closest.memory, b)})"
                                              if closest else "") + f"; with the largest on the host the device "
                   f"peaks at {gb(best.memory.peak('device'))}, the budget is {gb(b.device_usable)}")
    out += _table_reasons(best, b, fixed)
    split = [n for n in best.ps_tables if sharding is not None and n in sharding.whole]  # auto's, not yours
    out += _ps_reasons(best, b, split, sharding)
    kept = sorted(set(fixed) - set(split))  # a table host_device_mix=1 put on the host may be split there
    if kept:
        out.append(f"kept where you placed them (placement.tables, placement.host_device_mix, placement.ps): "
                   f"{', '.join(kept[:8])}{' ...' if len(kept) > 8 else ''}")
    return out


def _table_reasons(best: Candidate, b: Budget, fixed: set[str], shown: int = 8) -> list[str]:
    moved = [n for n in best.host_tables if n not in fixed]  # a table moved and then split is said by _ps_reasons
    if not moved:
        return []
    mem = best.memory
    at_rest = sum(t.bytes for t in mem.terms if t.where == "device" and t.phase == "always")
    busiest = mem.peak("device") - at_rest
    left = b.device_usable - mem.peak("device")
    out = []
    for name in moved[:shown]:
        size = sum(t.bytes for t in mem.terms if t.phase == "always" and _owner_of(t.name) == name)
        out.append(f"{name} -> host: on the device it needs {gb(size)} (weights and states); the device budget "
                   f"{gb(b.device_usable)} keeps {gb(at_rest)} at rest and {gb(busiest)} in its busiest phase, so "
                   f"{gb(max(0, left))} is left")
    if len(moved) > shown:
        out.append(f"... and {len(moved) - shown} more tables -> host (plan.json lists them)")
    return out


def _ps_reasons(best: Candidate, b: Budget, split: list[str], sharding: Sharding | None,
                shown: int = 8) -> list[str]:
    """Why each table auto ``split`` is split: what a copy per rank would cost a host against its budget; the
    runner-up (that one table as a copy per rank on the host) and what it would need."""
    if not split or sharding is None:
        return []
    mem, ranks = best.memory, best.memory.nproc_per_node
    out = []
    for name in split[:shown]:
        whole = sharding.whole[name]
        share = sum(t.bytes for t in sharding.terms[name] if t.phase == "always")
        out.append(f"{name} -> ps, rows split over {sharding.group} ranks: a copy per rank needs "
                   f"{gb(ranks * whole)} per host ({ranks} ranks × {gb(whole)}, weights and states), the host budget "
                   f"is {gb(b.host_usable)}; split, a rank holds {gb(share)} ({gb(ranks * share)} per host). "
                   f"Runner-up: a copy per rank on the host, {gb(mem.host_total + ranks * (whole - share))} per host")
    if len(split) > shown:
        out.append(f"... and {len(split) - shown} more tables -> ps (plan.json lists them)")
    return out


def infeasible(cands: list[Candidate], b: Budget, group: int = 1) -> list[str]:
    """One paragraph: the closest candidate's shortfall and fixes with numbers. ``group``: the ranks a ps table's
    rows are split over."""
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
        launcher = close.memory.host_runtime
        one = (close.memory.rank_peak + launcher) / (1 - b.reserve)
        same = (f"the same {close.memory.nproc_per_node} ranks over more hosts (cluster.nnodes)" +
                (": with fewer ranks the tables split over fewer, and each rank needs more" if close.ps_tables else ""))
        fixes.append(f"each rank needs {per} of host memory, so a host holds {k}: cluster.nproc_per_node={k}, {same}"
                     if k else f"each rank needs {per} of host memory and the launcher "
                     f"{'and its forkserver ' if close.memory.forkserver else ''}{gb(launcher)}: "
                     f"cluster.host_memory_gb={setting(one)} runs one rank a host, cluster.nproc_per_node=1, {same}")
        fixes += _ps_hosts(close, b, group)
        if b.reserve >= 0.5:
            fixes.append(f"placement.reserve={b.reserve} keeps {b.reserve:.0%} of each budget free: a lower one")
    if "device" in over:
        fixes.append(f"cluster.device_memory_gb={setting(close.memory.peak('device') / (1 - b.reserve))}, or fewer "
                     f"samples per micro-batch (batch.micro_size)")
    big = sorted(close.memory.terms, key=lambda t: -t.bytes)[:3]
    fixes.append(f"the largest terms are {', '.join(f'{t.name} {gb(t.bytes)} ({t.where})' for t in big)}")
    split = f", split over the ranks: {len(close.ps_tables)}" if close.ps_tables else ""
    return [f"placement=auto: nothing fits. The closest layout ({close.words()}, tables on the host: "
            f"{len(close.host_tables)}{split}) {shortfall(close.memory, b)}. Fixes: {'; '.join(fixes)}."]


def _ps_hosts(c: Candidate, b: Budget, group: int) -> list[str]:
    """With tables split over the ranks a host holds 1 / nnodes of them: how many hosts (of as many ranks as now)
    would hold them beside everything else a host needs."""
    if not c.ps_tables or group <= 1:
        return []
    split = set(c.ps_tables)
    share = sum(t.bytes for t in c.memory.terms if t.phase == "always" and _owner_of(t.name) in split)
    room = b.host_usable - (c.memory.host_total - c.memory.nproc_per_node * share)
    if room <= 0:
        return []
    job = share * group
    hosts = -(-job // room)
    return [f"the tables split over the ranks (ps) hold {gb(job)} in all; a host has {gb(room)} for its share beside "
            f"the rest, so {hosts} hosts of {c.memory.nproc_per_node} ranks hold them (cluster.nnodes={hosts})"]


def override_words(overrides: dict) -> list[str]:
    """The chosen keys in words (a dict of per-table places: how many on the host)."""
    out = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            host = [k for k, v in value.items() if v == "host"]
            ps = [k for k, v in value.items() if v == "ps"]
            split = f", {len(ps)} split over the ranks (ps)" if ps else ""
            out.append(f"{key}: {len(host)} of {len(value)} on the host{split}" if value else f"{key}: none")
        else:
            out.append(f"{key}={value}")
    return out
