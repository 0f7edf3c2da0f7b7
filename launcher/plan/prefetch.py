"""placement.prefetch: how many micro-batches ahead the host tables' rows are gathered (launcher/tables/prefetch.py),
decided purely from the placement and the parallel layout.

It applies to tables with a whole copy on each rank's host (placement.host_device_mix=1, placement.tables.<name>=host)
in a recipe run without pipeline stages, tensor parallel, FSDP2 or ZeRO-3: the rank learns a micro-batch's ids by
running its model's forward up to the last lookup, which must not start those parts' parameter gathers or a stage's
receive. Device tables need no prefetch (their gather is on the device), and ps tables are looked up by all-to-alls on
the training thread: both are looked up when the forward asks, as is every table of a script's own loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launcher.plan.parallel import ParallelDims
from launcher.plan.placement import PlacementPlan
from launcher.plan.registry import TABLE_OPTIMIZERS

AUTO_WHY = {
    "cpu": ("placement.prefetch=auto is 0 on CPU ranks: measured no faster here (bench/host_overlap.py, wide_deep at "
            "4 M rows per table on 2 cores: 0.87x and 0.92x with 2 ranks, 0.84x, 0.91x and 1.07x with 1), as the prefetch "
            "thread has no core its rank's own threads leave free; placement.prefetch=1 turns it on"),
    "cuda": ("placement.prefetch=auto is 0 on CUDA: the side-stream prefetch has not run on a GPU yet; "
             "placement.prefetch=1 turns it on"),
}
"""Why auto chose 0, by device type: prefetch is on by default only where it was measured to win, and so far it was
measured nowhere to win (it moves ~10 of 55 ms a step off the training thread at 4 M rows per table, which pays only
where another core, or a GPU, does the rest meanwhile)."""
MAX_DEPTH = 8


def prefetch_depth(value: Any) -> tuple[int | None, list[str]]:
    """(None for auto, or the depth asked; problems) of the placement.prefetch value."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None, []
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DEPTH:
        return value, []
    return 0, [f"placement.prefetch={value!r} must be auto, 0 (each table looked up when the forward asks) or the "
               f"micro-batches whose host-table rows are gathered ahead, 1 to {MAX_DEPTH} (each holds its batch and "
               f"rows; one thread gathers them in turn). Set placement.prefetch=auto."]


def why_not(placement: PlacementPlan, dims: ParallelDims, zero: int) -> str:
    """Why no table of this run can be prefetched ('' when some can)."""
    if not placement.sparse_tables or not any(t.on_host and not t.sharded for t in placement.tables):
        return ("no table of this run has a copy on each rank's host (prefetch gathers those: "
                "placement.host_device_mix=1 or placement.tables.<name>=host; device tables are gathered on the "
                "device and ps tables by all-to-alls, when the forward asks)")
    if dims.pp > 1:
        return (f"the run has {dims.pp} pipeline stages: the schedule runs a step's micro-batches itself and a later "
                f"stage's ids come from the stage before")
    for on, part in ((dims.tp > 1, f"tensor parallel (parallel.tp={dims.tp})"),
                     (dims.dp_shard > 1, f"FSDP2 sharding over {dims.dp_shard} ranks"), (zero == 3, "ZeRO-3")):
        if on:
            return (f"{part} gathers parameters in the forward, and the pass that learns the next micro-batch's "
                    f"ids runs the forward up to its lookups")
    return ""


def plan_prefetch(value: Any, placement: PlacementPlan, dims: ParallelDims, zero: int, device_type: str
                  ) -> tuple[PlacementPlan, list[str]]:
    """(placement with ``prefetch`` and ``prefetch_words`` set, problems). A depth asked for where it cannot apply
    is refused with the reason (it would do nothing); auto is 0, with the reason (AUTO_WHY)."""
    depth, problems = prefetch_depth(value)
    if problems:
        return placement, problems
    reason = why_not(placement, dims, zero)
    if reason and depth:
        return placement, [f"placement.prefetch={depth} would do nothing: {reason}. Set placement.prefetch=0 "
                           f"(or auto)."]
    if reason:
        return replace(placement, prefetch=0, prefetch_words=f"when the forward asks: {reason}"), []
    if depth is None:
        why = AUTO_WHY.get(device_type, AUTO_WHY["cuda"])
        return replace(placement, prefetch=0, prefetch_words=f"when the forward asks ({why})"), []
    return replace(placement, prefetch=depth, prefetch_words=_words(placement, depth)), []


def kernels_words(placement: PlacementPlan, kernels: str, device_type: str, fbgemm: str = "") -> str:
    """Which tables the C kernels (launcher/tables/kernels.c) or torch's ops step, in words ('' without such
    tables): tables in host memory, or on a CPU device, take the host's choice; tables on a CUDA device torch's
    ops. ``fbgemm`` (HostFacts.table_fbgemm): where fbgemm_gpu is installed, why the tables whose optimizer FBGEMM
    also has stay off its kernels."""
    host = [t.name for t in placement.tables if t.on_host or (t.outside and device_type == "cpu")]
    if not host or not kernels:
        return ""
    optimizers = "/".join(sorted({t.optimizer for t in placement.tables if t.name in host}))
    words = f"{', '.join(host)}: gather, gradient coalesce and {optimizers} update on {kernels}"
    theirs = [t.name for t in placement.tables if t.name in host and t.optimizer in TABLE_OPTIMIZERS
              and TABLE_OPTIMIZERS[t.optimizer].fbgemm]
    return f"{words}; {', '.join(theirs)}: {fbgemm}" if fbgemm and theirs else words


def _words(placement: PlacementPlan, depth: int) -> str:
    host = [t.name for t in placement.tables if t.on_host and not t.sharded]
    others = [t.name for t in placement.tables if t.outside and t.name not in host]
    rest = f"; {', '.join(others)} when the forward asks" if others else ""
    if depth == 0:
        return f"when the forward asks (placement.prefetch=0){rest}"
    ahead = "1 micro-batch" if depth == 1 else f"{depth} micro-batches"
    return (f"{', '.join(host)}: rows gathered {ahead} ahead on a background thread (placement.prefetch={depth}), "
            f"after each step's writes of the rows they need; the other rows written meanwhile{rest}")
