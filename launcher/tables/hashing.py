"""Raw feature ids -> table rows, inside the lookup (``tables.<name>.hash: <buckets>``), so the model and its data
keep raw int64 ids (Criteo's hashed 32-bit categories, a production system's 64-bit feature ids) and the table has
as many rows as the plan sizes it.

Two functions, named by ``tables.<name>.hash_fn``:

- ``mix`` (default): splitmix64's finaliser (Steele, Lea and Flood 2014; the mixer of Java's SplittableRandom and
  of many hash tables) over the id's 64 bits, then the remainder by the buckets. Ids that differ in any bit spread
  over the buckets however they were assigned (sequential ids, ids that share low bits).
- ``mod``: the id's remainder by the buckets (Python's: never negative), TorchRec's convention for Criteo
  (``torchrec.datasets.criteo``: ``int(value, 16) % num_embeddings``); keeps consecutive ids in consecutive rows.

A table with ``padding_idx`` keeps it for the id equal to it (a model's "no value"); every other id is hashed into
the other ``buckets - 1`` rows. Ids that share a row (a collision) share its embedding and its optimizer state, as
in every hashed table; ``HashStats`` counts them per batch (distinct ids against distinct rows), which costs no
memory per id. What is left out, and where users find it: admission of new ids by frequency and eviction of stale
rows (TorchRec's managed-collision modules, Huawei mxRec's dynamic hash tables), tables that grow with new ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FUNCTIONS = ("mix", "mod")
"""What ``tables.<name>.hash_fn`` may name."""

_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers, as two's-complement int64
_M2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic: it copies the sign bit)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64, as the C original's)."""
    x = x ^ _shift_right(x, 30)
    x = x * _M1
    x = x ^ _shift_right(x, 27)
    x = x * _M2
    return x ^ _shift_right(x, 31)


@dataclass(frozen=True)
class IdHash:
    buckets: int
    """Rows the ids are hashed into: the table's first ``buckets`` rows."""
    function: str = "mix"
    padding_idx: int | None = None
    """The table's padding row: the id equal to it stays there, no other id is hashed to it."""

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Row of each raw id (int64, the same shape)."""
        raw = ids.long()
        mixed = mix64(raw) if self.function == "mix" else raw
        pad = self.padding_idx if self.padding_idx is not None and 0 <= self.padding_idx < self.buckets else None
        rows = torch.remainder(mixed, self.buckets - (pad is not None))
        if pad is None:
            return rows
        rows = rows + (rows >= pad).long()  # skip the padding row
        return torch.where(raw == pad, torch.full_like(rows, pad), rows)


def _distinct(t: torch.Tensor) -> torch.Tensor:
    """How many distinct values ``t`` holds, as a tensor where ``t`` is (no host sync on a GPU)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return flat.new_zeros((), dtype=torch.int64)
    ordered = flat.sort().values
    return (ordered[1:] != ordered[:-1]).sum() + 1


@dataclass
class HashStats:
    """Per hashed table, summed over the batches a rank looked up while training: ids, distinct ids per batch, and
    distinct rows they landed in per batch. ``distinct - rows`` is how many of a batch's distinct ids shared a row
    with another id of the same batch (collisions in the batch, a lower bound of those over the whole data). The
    per-batch counts stay tensors where the ids are until they are read (``to_dict``)."""

    ids: int = 0
    distinct: Any = 0
    rows: Any = 0
    batches: int = 0

    def add(self, raw: torch.Tensor, rows: torch.Tensor) -> None:
        self.ids += raw.numel()
        self.distinct = self.distinct + _distinct(raw)
        self.rows = self.rows + _distinct(rows)
        self.batches += 1

    def to_dict(self) -> dict[str, float | int]:
        self.distinct, self.rows = int(self.distinct), int(self.rows)
        collided = self.distinct - self.rows
        return {"ids": self.ids, "distinct_ids_per_batch": self.distinct, "rows_per_batch": self.rows,
                "collided": collided, "collided_share": round(collided / self.distinct, 6) if self.distinct else 0.0,
                "batches": self.batches}
