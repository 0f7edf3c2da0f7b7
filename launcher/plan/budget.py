"""Memory budgets (pure): what one device and one host may hold, and whether a memory plan fits them.

Capacities are cluster.device_memory_gb / cluster.host_memory_gb, or what the host reported (HostFacts: its RAM or
its cgroup's limit, its smallest GPU). On a CPU-only host the device is host memory: its budget, unless given, is the
rank's share of the host's. ``placement.reserve`` of each is kept free. A plan over a capacity is refused with fixes
that carry numbers; one over the budget but under the capacity is said."""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.plan.peak import MemoryPlan
from launcher.units import GB, gb


@dataclass(frozen=True)
class Budget:
    device: int
    """Bytes one device may hold; 0 = unknown (not checked)."""
    host: int
    """Bytes one host may hold (its ranks and the launcher); 0 = unknown."""
    reserve: float
    device_source: str
    host_source: str

    @property
    def device_usable(self) -> int:
        return int(self.device * (1 - self.reserve))

    @property
    def host_usable(self) -> int:
        return int(self.host * (1 - self.reserve))


def budget_of(device_gb: float, host_gb: float, reserve: float, host_memory: int, device_memory: int,
              device_type: str, nproc: int) -> Budget:
    """The budgets from the cluster keys, else the host's facts."""
    host, host_src = (int(host_gb * GB), "cluster.host_memory_gb") if host_gb > 0 else \
        (host_memory, "this host's memory (cluster.host_memory_gb to set it)")
    if device_gb > 0:
        device, device_src = int(device_gb * GB), "cluster.device_memory_gb"
    elif device_type == "cuda":
        device, device_src = device_memory, "the smallest visible GPU (cluster.device_memory_gb to set it)"
    else:
        device, device_src = 0, "a CPU host: the device is host memory (cluster.device_memory_gb to bound it)"
    return Budget(device=device, host=host, reserve=reserve, device_source=device_src, host_source=host_src)


def overs(mem: MemoryPlan, b: Budget, usable: bool = True) -> dict[str, int]:
    """{device|host: bytes over} of ``mem`` against ``b`` (usable: less the reserve; else the capacity)."""
    out = {}
    dev_cap, host_cap = (b.device_usable, b.host_usable) if usable else (b.device, b.host)
    if b.device and mem.peak("device") > dev_cap:
        out["device"] = mem.peak("device") - dev_cap
    if b.host and mem.host_total > host_cap:
        out["host"] = mem.host_total - host_cap
    return out


def fits(mem: MemoryPlan, b: Budget) -> bool:
    return not overs(mem, b)


def shortfall(mem: MemoryPlan, b: Budget) -> str:
    """Words for what ``mem`` lacks: 'needs 1.3 TB of host memory per host, has 1 TB (less 10 % reserve: 0.9 TB)'."""
    out = []
    for where, over in overs(mem, b).items():
        need = mem.peak("device") if where == "device" else mem.host_total
        cap = b.device if where == "device" else b.host
        per = "per device" if where == "device" else "per host"
        out.append(f"needs {gb(need)} of {where} memory {per}, has {gb(cap)} ({b.reserve:.0%} kept free: "
                   f"{gb(cap * (1 - b.reserve))}), {gb(over)} over")
    return "; ".join(out)


def check_fit(mem: MemoryPlan, b: Budget, traced: bool, host_fixes: tuple[tuple[str, int], ...] = ()
              ) -> tuple[list[str], list[str]]:
    """(problems, notes) of a plan's memory against its budgets: over a capacity is refused (it would run out of
    memory), over the budget with its reserve is said. ``host_fixes``: more fixes for a host over its capacity (the
    plan's: its tables split over the ranks), each with the bytes it saves a host: only one that saves enough is
    offered."""
    hard = overs(mem, b, usable=False)
    untraced = "" if traced else " (activations not traced: placement=auto or recompute traces them)"
    if hard:
        fix = ["placement=auto searches for a placement that fits (and says so when none does)"]
        if "host" in hard:
            k = ranks_that_fit(mem, b)
            fix += [words for words, saved in host_fixes if saved >= hard["host"]]
            fix.append(f"cluster.nproc_per_node={k} (a host holds {k} rank(s) of {gb(mem.rank_peak)})" if k else
                       f"a host with more memory: cluster.host_memory_gb={setting(mem.host_total)} or more (this "
                       f"plan's {gb(mem.host_total)})")
        if "device" in hard:
            fix.append(f"a device with more memory: cluster.device_memory_gb={setting(mem.peak('device'))} or more "
                       f"(this plan's {gb(mem.peak('device'))})")
        return [f"memory: this plan {shortfall(mem, b)}{untraced}. Fixes: {'; '.join(fix)}."], []
    if overs(mem, b):
        return [], [f"memory: over its budget, within its capacity: {shortfall(mem, b)}; placement.reserve="
                    f"{b.reserve} is what is kept free"]
    return [], []


def setting(n: int) -> str:
    """Bytes as a cluster.*_memory_gb value that holds them: GB rounded up to two significant digits (2.53 MB ->
    0.0026; a size rounded down to what was shown had been refused again)."""
    x = n / GB
    step = 10.0 ** (math.floor(math.log10(x)) - 1) if x > 0 else 1.0
    digits = max(0, -int(math.floor(math.log10(step))))
    value = math.ceil(round(x / step, 9)) * step
    if int(float(f"{value:.{digits}f}") * GB) < n:  # (the budget is int(value * GB): a float just below)
        value += step
    return f"{value:.{digits}f}"


def ranks_that_fit(mem: MemoryPlan, b: Budget) -> int:
    """Ranks of this plan one host's usable memory holds beside the launcher."""
    return max(0, (b.host_usable - mem.host_runtime) // max(1, mem.rank_peak))
