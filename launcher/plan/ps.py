"""Parameter-server mode in the plan (pure): a table's rows split over the ranks of its pipeline stage.

``placement.ps=true`` (every table outside the parts) or ``placement.tables.<name>=ps`` (one table) gives the table
``shards`` = the ranks of its stage (world size / pipeline stages); each owns one contiguous block of ceil(rows /
shards) rows and that block's optimizer states in host memory (launcher/tables/partition.py), so the job holds one
copy instead of one per rank. What may be split, how much one rank holds, and the fix a plan over its host memory
gets are said here; the memory model (peak.py, memory.py), placement=auto (auto.py) and the views ask this module."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.errors import did_you_mean
from launcher.plan.registry import TABLE_OPTIMIZERS, table_state_bytes
from launcher.units import gb

if TYPE_CHECKING:
    from launcher.plan.parallel import ParallelDims
    from launcher.plan.placement import PlacementPlan, TablePlan

PLACES = ("host", "device", "ps")
"""What placement.tables.<name> may say: a whole copy on each rank's host or device, or its rows split over the
ranks' host memory (parameter-server mode)."""


def rows_per_rank(t: TablePlan) -> int:
    """Rows of ``t`` one rank holds: all of them, or its block of ceil(rows / shards) in parameter-server mode (the
    first ranks' share, the largest; trailing ranks may hold fewer)."""
    return -(-t.rows // max(1, t.shards))


def stage_ranks(dims: ParallelDims | None) -> int:
    """The ranks of one pipeline stage (world size / pipeline stages; every rank without stages): a ps table's rows
    are split over them. 1 while the mesh is unknown (its problem is said already)."""
    return dims.world_size // dims.pp if dims is not None else 1


def place_problems(name: str, want: str, opt: str, named: bool) -> list[str]:
    """What is wrong with placing table ``name`` (optimizer ``opt``) at ``want``; ``named``: placement.tables.<name>
    said it (else host_device_mix or placement.ps did)."""
    if want not in PLACES:
        hint = did_you_mean(str(want), PLACES, f"placement.tables.{name}=")
        return [f"placement.tables.{name}={want} must be host, device or ps (rows split over the ranks' host "
                f"memory).{hint}"]
    if opt == "dense" and named and want in ("host", "ps"):
        how = "to keep it on the host" if want == "host" else "to split its rows over the ranks"
        return [f"placement.tables.{name}={want} with tables.{name}.optimizer=dense: a dense table trains inside the "
                f"engine on the device. Set tables.{name}.optimizer=lazy_adam (or ftrl) {how}."]
    spec = TABLE_OPTIMIZERS.get(opt)
    if want == "ps" and spec is not None and spec.sparse and not spec.shardable:
        key = f"placement.tables.{name}=ps" if named else "placement.ps=true"
        return [f"{key} with tables.{name}.optimizer={opt}: the table store cannot split torch's SparseAdam state "
                f"over the ranks (it keeps the state of the whole weight). Set tables.{name}.optimizer=lazy_adam: "
                f"the same update, row-fused, its state split with the rows."]
    return []


def placed(t: TablePlan, where: str, group: int) -> TablePlan:
    """Table ``t`` at ``where`` (placement.tables.<name>'s values: host, device or ps over ``group`` ranks), as
    placement=auto's choice puts it."""
    if where == "ps":
        return dataclasses.replace(t, location="host", shards=group)
    return dataclasses.replace(t, location=where, shards=1)


def shardable(t: TablePlan) -> bool:
    """Whether ``t`` could be split over the ranks and is not: outside the parts, a whole copy per rank, with an
    optimizer whose state splits with the rows."""
    spec = TABLE_OPTIMIZERS.get(t.optimizer)
    return t.outside and not t.sharded and spec is not None and spec.shardable


def ps_fixes(placement: PlacementPlan, group: int, ranks_per_host: int) -> tuple[tuple[str, int], ...]:
    """A fix for a host over its capacity when tables that could be split over the ranks are copied to each: its
    words and the bytes it saves a host (each such table and its states, less the share a rank keeps)."""
    split = [t for t in placement.tables if shardable(t)]
    if group <= 1 or not split:
        return ()
    whole = sum(t.rows * t.dim * 4 + table_state_bytes(t.optimizer, t.rows, t.dim) for t in split)
    saved = whole * (group - 1) // group * ranks_per_host
    return ((f"placement.ps=true (each table's rows split over {group} ranks: one copy per job instead of one per "
             f"rank, {gb(saved)} less a host)", saved),)


INITS = ("auto", "whole", "blocks")
"""placement.ps_init: how a rank gets its block of a split table (TablePlan.built)."""


def _built(placement: PlacementPlan, built: str) -> PlacementPlan:
    return dataclasses.replace(placement, tables=tuple(dataclasses.replace(t, built=built) if t.sharded else t
                                                       for t in placement.tables))


def plan_build(mode: str, placement: PlacementPlan, remodel: Callable[[PlacementPlan], tuple], host_usable: int
               ) -> tuple[PlacementPlan, tuple, list[str], list[str]]:
    """(placement, remodel(placement), notes, problems): placement.ps_init applied to the split tables. ``remodel``
    gives a placement's (memory, pipeline, peak); ``host_usable``: the host budget (0: unknown). auto builds whole
    (the same initial values as a run without ps) unless that makes a host go over its budget."""
    if mode not in INITS:
        return placement, remodel(placement), [], [
            f"placement.ps_init={mode} must be auto, whole or blocks (how each rank gets its block of a split table)."]
    whole = _built(placement, "whole")
    result = remodel(whole)
    if not any(t.sharded for t in placement.tables):
        unused = [f"placement.ps_init={mode} is not used: no table is split over the ranks (placement.ps=true or "
                  f"placement.tables.<name>=ps split one)"] if mode != "auto" else []
        return whole, result, unused, []
    if mode == "whole":
        return whole, result, [], []
    if mode == "auto" and (not host_usable or result[2].host_total <= host_usable):
        return whole, result, [], []
    blocks = _built(placement, "blocks")
    notes = [f"placement.ps_init=auto -> blocks: building the split tables whole needs {gb(result[2].host_total)} "
             f"per host, over its budget ({gb(host_usable)}); each rank makes only its rows (initial values drawn per "
             f"65,536-row chunk, not those of a whole build)"] if mode == "auto" else []
    return blocks, remodel(blocks), notes, []
