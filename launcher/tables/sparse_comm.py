"""Average row-sparse gradients over data-parallel ranks: every rank ends with the same (rows, values) per table.

``reduce_tables`` exchanges every table's gradient in one fixed sequence of three all-gathers (the counts, the rows,
the values), whatever tables got gradients on this rank: a rank whose batch missed a table sends zero rows of it,
so every rank issues the same collectives every step. Tables looked up with the same ids (Wide&Deep's two tables)
travel and coalesce together when every rank says so: their rows are sent once and their values side by side.

Coalescing is deterministic (CPU: index_add_ in index order; CUDA: stable sort + segment sum, no atomics) and every
rank reduces the same gathered data in rank order, so every rank's copy of a table stays bit-identical.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import launcher.tables.kernels as kernels


def coalesce(rows: torch.Tensor, values: torch.Tensor, known: tuple[torch.Tensor, torch.Tensor] | None = None,
             any_order: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique sorted rows and the sum of the values of each, in a deterministic order. ``known``: (unique, inverse)
    of ``rows`` on the CPU, already computed (by the prefetch thread): the same sums, without the sort.
    ``any_order``: the caller takes the rows in any order; on the CPU the C kernel (launcher/tables/kernels.py)
    then gives the same rows and sums (a hash and a radix sort of the distinct rows instead of torch's sort, fill
    and scatter)."""
    if rows.numel() == 0:
        return rows, values
    if any_order and known is None and kernels.coalescable(rows, values):
        return kernels.coalesce(rows, values, 1 << 62)
    if rows.device.type == "cpu":
        # CPU index_add_ accumulates in index order (no atomics): deterministic, and 1.6x faster than the sort path.
        unique, inverse = known or torch.unique(rows, sorted=True, return_inverse=True)
        return unique, values.new_zeros(len(unique), *values.shape[1:]).index_add_(0, inverse, values)
    order = torch.sort(rows, stable=True).indices
    rows, values = rows[order], values[order]
    unique, counts = torch.unique_consecutive(rows, return_counts=True)
    summed = torch.segment_reduce(values, "sum", lengths=counts, axis=0)
    return unique, summed


def coalesce_all(parts: list[tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]]
                 ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[bool | None]]:
    """``coalesce(rows, values, known, any_order=True)`` of each part, those the C kernels take in one call (spread
    over the rank's threads), the others one by one; and per part whether its sums are all finite, where the kernels
    checked them in that call (None: not checked). Consecutive parts with the same ``rows`` tensor (tables looked up
    with one ids tensor) have their rows sorted once: by the kernels, or on the CPU by one torch.unique."""
    fused = [i for i, (r, v, k) in enumerate(parts) if k is None and r.numel() and kernels.coalescable(r, v)]
    out: list = [None] * len(parts)
    finite: list[bool | None] = [None] * len(parts)
    if fused:
        got, checked = kernels.coalesce_checked([parts[i][:2] for i in fused], 1 << 62)
        for i, one, ok in zip(fused, got, checked):
            out[i], finite[i] = one, ok
    last: tuple[torch.Tensor, Any] | None = None  # the previous part's rows and their (unique, inverse)
    for i, (rows, values, known) in enumerate(parts):
        if out[i] is None:
            if known is None and rows.device.type == "cpu" and rows.numel():
                if last is None or last[0] is not rows:
                    last = rows, torch.unique(rows, sorted=True, return_inverse=True)
                known = last[1]
            out[i] = coalesce(rows, values, known, any_order=True)
    return out, finite


def _all_gather(t: torch.Tensor, group, world: int) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=group)
    return out


def _padded(parts: list[torch.Tensor], length: int, like: torch.Tensor) -> torch.Tensor:
    flat = torch.cat(parts) if parts else like.new_zeros(0)
    return torch.cat([flat, flat.new_zeros(length - flat.numel())])


def group_size(group=None) -> int:
    """How many ranks ``group`` has (1 without a process group)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def reduce_tables(local: list[tuple[torch.Tensor, torch.Tensor] | None], dims: list[int], shares: list[int],
                  group=None, device: torch.device | None = None) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """The mean over ``group`` of each table's row-sparse gradient. ``local[t]``: this rank's coalesced (rows,
    values (rows, dims[t])) of table t, or None; ``shares[t]``: an earlier table whose rows table t's are on this
    rank (-1: none). Returns per table its (rows, mean values), coalesced, or None when no rank had any."""
    device = device or torch.device("cpu")
    world = group_size(group)
    if world == 1:  # each table's gradient is coalesced already: nothing to exchange, nothing to sum
        return list(local)
    n_tables = len(local)
    counts = [0 if x is None else len(x[0]) for x in local]
    header = torch.tensor(counts + shares, dtype=torch.int64, device=device)
    headers = torch.stack(_all_gather(header, group, world))
    n, sh = headers[:, :n_tables].tolist(), headers[:, n_tables:].tolist()
    fused = [s if s >= 0 and all(h[t] == s for h in sh) else -1 for t, s in enumerate(sh[0])]
    send_rows = [t for t in range(n_tables) if fused[t] < 0]
    empty_rows = torch.zeros(0, dtype=torch.int64, device=device)
    empty_values = torch.zeros(0, dtype=torch.float32, device=device)
    rows_len = max(sum(c[t] for t in send_rows) for c in n)
    values_len = max(sum(c[t] * dims[t] for t in range(n_tables)) for c in n)
    rows_out = _padded([local[t][0] for t in send_rows if local[t] is not None], rows_len, empty_rows)
    values_out = _padded([x[1].reshape(-1) for x in local if x is not None], values_len, empty_values)
    all_rows, all_values = _all_gather(rows_out, group, world), _all_gather(values_out, group, world)
    per_rank = [_unpack(r, v, c, dims, send_rows) for r, v, c in zip(all_rows, all_values, n)]
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_tables
    for root in send_rows:
        members = [root] + [t for t in range(n_tables) if fused[t] == root]
        rows = torch.cat([rank_rows[root] for rank_rows, _ in per_rank])
        if rows.numel() == 0:
            continue
        each = [(rows, torch.cat([rank_values[t] for _, rank_values in per_rank]), None) for t in members]
        for t, (unique, summed) in zip(members, coalesce_all(each)[0]):  # the members' rows sorted once
            out[t] = (unique, summed / world)
    return out


def _unpack(rows: torch.Tensor, values: torch.Tensor, counts: list[int], dims: list[int],
            send_rows: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """One rank's gathered buffers split back into each table's rows and values."""
    out_rows, out_values, r, v = {}, {}, 0, 0
    for t in send_rows:
        out_rows[t] = rows[r:r + counts[t]]
        r += counts[t]
    for t, (c, d) in enumerate(zip(counts, dims)):
        out_values[t] = values[v:v + c * d].view(c, d)
        v += c * d
    return out_rows, out_values
