"""The memory model in a dry run and a plan view: per rank and per host, device and host bytes against their
budgets, every term (where, when, how it is known), the largest consumers, the estimated step time, and
placement=auto's decisions (the planner statistics TorchRec prints, plus the terms it leaves out)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from launcher.plan.budget import Budget
from launcher.plan.peak import MemoryPlan
from launcher.plan.types import LaunchPlan
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
             + f" + launcher {gb(mem.launcher)} = "
             f"{gb(mem.host_total)}{_share(mem.host_total, host_cap)}"]
    if b is not None:
        lines.append(f"budgets: device from {b.device_source}; host from {b.host_source}; "
                     f"placement.reserve {b.reserve:.0%} kept free")
    return lines


def _short(source: str, width: int = 60) -> str:
    """A term's source up to its first parenthesis, cut to ``width`` (plan.json has it whole)."""
    head = source.split(" (")[0]
    return head if len(head) <= width else head[:width - 1] + "…"


def terms_table(mem: MemoryPlan) -> Table:
    t = Table(title="memory of one rank at its peak (always + the largest of backward / step / save)",
              title_justify="left")
    for col in ("term", "where", "when", "bytes", "basis", "from"):
        t.add_column(col, overflow="fold")
    terms = sorted(mem.terms, key=lambda x: -x.bytes)
    for x in terms[:SHOWN_TERMS]:
        t.add_row(escape(x.name), x.where, x.phase, gb(x.bytes), x.basis, escape(_short(x.source)))
    rest = terms[SHOWN_TERMS:]
    if rest:
        t.add_row(f"{len(rest)} more", "", "", gb(sum(x.bytes for x in rest)), "", "plan.json lists every term")
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
