"""How a parameter-server table's rows are split over the ranks of its group: by range, in contiguous blocks.

Rank i owns rows [i * c, min((i + 1) * c, rows)) with c = ceil(rows / n): torch.chunk's split and DTensor's
``Shard(0)``, so a rank's block (and its optimizer states) is the local tensor of a DTensor and
``torch.distributed.checkpoint`` saves and reshards it on load onto any number of ranks. Trailing ranks may own fewer
rows (or none when rows < n).

Why range and not hash: with range blocks a batch's sorted unique ids are already grouped by owner (the owner is
monotone in the id), so routing them needs no sort, and each rank's rows are one DTensor shard. Balance is the
cost: range blocks balance the rows (within one block's rounding) but not the lookups when popular ids cluster in one
range; ``bench/ps_bench.py`` measures the lookups each owner serves on synthetic_ctr.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import launcher.tables.hugepages as hugepages


@dataclass(frozen=True)
class RowPartition:
    rows: int
    parts: int

    @property
    def block(self) -> int:
        """Rows per rank (the last ranks may have fewer)."""
        return max(1, -(-self.rows // self.parts))

    def bounds(self, rank: int) -> tuple[int, int]:
        """[start, stop) of the global rows ``rank`` owns."""
        return min(rank * self.block, self.rows), min((rank + 1) * self.block, self.rows)

    def owned(self, rank: int) -> int:
        start, stop = self.bounds(rank)
        return stop - start

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """The rank that owns each id."""
        return torch.div(ids, self.block, rounding_mode="floor")

    def counts(self, sorted_ids: torch.Tensor) -> list[int]:
        """How many of ``sorted_ids`` (ascending) each rank owns: they are grouped by owner, in rank order."""
        return torch.bincount(self.owner(sorted_ids), minlength=self.parts).tolist()

    def block_of(self, weight: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s rows of a whole table, copied to the host in fp32 (the whole can then be freed)."""
        start, stop = self.bounds(rank)
        rows = weight.detach()[start:stop]
        return hugepages.advised(torch.empty(rows.shape, dtype=torch.float32)).copy_(rows)

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's row in its owner's block."""
        return ids - self.owner(ids) * self.block
