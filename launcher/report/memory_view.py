"""The memory model in a dry run and a plan view: per rank and per host, device and host bytes against their
budgets, every term (where, when, how it is known), the largest consumers, the estimated step time, and
placement=auto's decisions (the planner statistics TorchRec prints, plus the terms it leaves out)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from launcher.errors import printable
from launcher.plan.budget import Budget
from launcher.plan.peak import MemoryPlan
from launcher.plan.types import LaunchPlan
from launcher.terminal import one_line
from launcher.units import gb

SHOWN_TERMS = 14
"""Terms listed by name (largest first); the rest are summed in one row."""


def _share(n: int, cap: int) -> str:
    return f" = {n / cap:.0%} of {gb(cap)}" if cap else " (no budget known)"


def memory_lines(mem: MemoryPlan, b: Budget | None) -> list[str]:
    """Per rank and per host, against the budgets."""
    dev_cap, host_cap = (b.device, b.host) if b else (0, 0)
    cpu = mem.device_type == "cpu"
    lines = [f"per rank: device {gb(mem.peak('device'))}{_share(mem.peak('device'), dev_cap)}, host "
             f"{gb(mem.peak('host'))}" + (f"; resident (both, one memory on a CPU host) {gb(mem.rank_peak)}" if cpu
                                          else ""),
             f"per host: {mem.nproc_per_node} rank(s) × {gb(mem.training_peak)}"
             + (f" + {gb(mem.build_extra)} while one builds the model (its tables whole)" if mem.build_extra else "")
             + f" + launcher {gb(mem.launcher)}" + (f" + forkserver {gb(mem.forkserver)}" if mem.forkserver else "")
             + f" = {gb(mem.host_total)}{_share(mem.host_total, host_cap)}"]
    if b is not None:
        lines.append(f"budgets: device from {b.device_source}; host from {b.host_source}; "
                     f"placement.reserve {b.reserve:.0%} kept free")
    return lines


def _short(source: str, width: int = 60) -> str:
    """A term's source up to its first parenthesis, cut to ``width`` (plan.json has it whole)."""
    head = source.split(" (")[0]
    return head if len(head) <= width else head[:width - 1] + "…"


def terms_table(mem: MemoryPlan, every: bool = False) -> Table:
    """The terms of one rank's peak, largest first: SHOWN_TERMS of them with their sources cut, or (``every``, for
    the run dir's plan.txt) every term with its whole source."""
    t = Table(title="memory of one rank at its peak (always + the largest of backward / step / save)",
              title_justify="left")
    for col in ("term", "where", "when", "bytes", "basis", "from"):
        t.add_column(col, overflow="fold")
    terms = sorted(mem.terms, key=lambda x: -x.bytes)
    shown = len(terms) if every else SHOWN_TERMS
    for x in terms[:shown]:
        source = x.source if every else _short(x.source)
        t.add_row(escape(x.name), x.where, x.phase, gb(x.bytes), x.basis, escape(source))
    rest = terms[shown:]
    if rest:
        t.add_row(f"{len(rest)} more", "", "", gb(sum(x.bytes for x in rest)), "", "plan.txt lists every term")
    return t


def memory_tree(plan: LaunchPlan) -> Tree:
    mem = plan.peak
    root = Tree("memory (the planner's model; rank.N/memory.json has what each rank measured)")
    for line in memory_lines(mem, plan.budget):
        root.add(escape(line))
    if plan.decisions:
        dec = root.add("placement=auto decided")
        for d in plan.decisions:
            dec.add(escape(d))
    return root


def largest_terms(mem: MemoryPlan, shown: int = 4) -> str:
    """The largest terms of one rank's peak on one line: 'N terms, the largest: runtime 246.4 MB (host, always), ...'."""
    terms = sorted(mem.terms, key=lambda x: -x.bytes)
    return f"{len(terms)} terms, the largest: " + ", ".join(
        f"{printable(x.name)} {gb(x.bytes)} ({x.where}, {x.phase})" for x in terms[:shown])


def compact_memory_tree(plan: LaunchPlan) -> Tree:
    """memory_tree in a few lines: per rank and per host against the budgets (whole: the numbers a placement is
    decided on), then one line each, cut at the terminal's width, for where the budgets come from, the largest terms,
    the activations and each of placement=auto's decisions. plan.txt in the run dir has every term (terms_table)."""
    mem = plan.peak
    root = Tree(one_line("memory (the planner's model; rank.N/memory.json has what each rank measured)"))
    lines = memory_lines(mem, plan.budget)
    for line in lines[:2]:
        root.add(Text(line))
    for line in [*lines[2:], largest_terms(mem)]:
        root.add(one_line(line))
    if plan.activations:
        a = plan.activations
        kept = f"activations kept for the backward, per micro-batch: {gb(a['kept_bytes'])}"
        if plan.recompute:
            kept += f"; {gb(a['kept_bytes_with_recompute'])} with recompute of {printable(', '.join(plan.recompute))}"
        root.add(one_line(kept))
    if plan.decisions:
        dec = root.add("placement=auto decided")
        for d in plan.decisions:
            dec.add(one_line(printable(d)))
    return root
