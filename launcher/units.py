"""The vocabulary of memory both the plan (launcher/plan/) and the parallel parts (launcher/parallel/) speak: bytes per
precision, a rank's bytes by kind (``Bytes``), one named term of the memory model (``Term``), a rank's share of a
split, and how bytes are written. A leaf: it imports nothing of the launcher, so the parts can say what memory they
need without importing the plan that asks them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GB", "WIDTH", "Bytes", "Term", "gb", "shard"]

GB = 10**9

WIDTH = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes per value of each training precision."""


@dataclass(frozen=True)
class Bytes:
    params: int = 0
    """Dense parameters (in the training precision; fp32 master copies count under optimizer)."""
    grads: int = 0
    """Dense gradients (and, with an offloaded optimizer, the fp32 gradient partition on the host)."""
    optimizer: int = 0
    """Dense optimizer states plus fp32 master weights where the part keeps them."""
    tables: int = 0
    """Sparse embedding tables (fp32)."""
    table_states: int = 0
    """Their optimizers' states (fp32)."""
    gathered: int = 0
    """Whole parameters and gradients a sharding part holds during a step only, beyond its shards (FSDP2 keeps a
    unit's gathered parameters from its forward to its backward below ZeRO-3 and in pipelines)."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.tables + self.table_states + self.gathered

    def plus(self, **more: int) -> Bytes:
        return Bytes(**{k: getattr(self, k) + more.get(k, 0) for k in self.__dataclass_fields__})


@dataclass(frozen=True)
class Term:
    name: str
    where: str
    """host or device."""
    bytes: int
    phase: str = "always"
    basis: str = "exact"
    """exact, traced, estimate or constant."""
    source: str = ""


def shard(nbytes: int, ways: int) -> int:
    """One rank's share of ``nbytes`` split ``ways`` ways (rounded up)."""
    return -(-nbytes // max(1, ways))


def gb(n: float) -> str:
    """Bytes in decimal units: MB below 1 GB, TB from 1 TB."""
    if abs(n) < GB:
        return f"{n / 10**6:.1f} MB"
    return f"{n / GB:.2f} GB" if abs(n) < 1000 * GB else f"{n / 10**12:.2f} TB"
