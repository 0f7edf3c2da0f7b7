"""The TableStore protocol: embedding tables trained outside the parallel parts, looked up from inside the model.

A store owns its tables' weights and optimizer states, where the plan placed them (host or device): ``lookup`` gives
a batch's rows to the model (as a leaf autograd tracks), ``collect`` keeps their gradients after a backward, ``step``
exchanges them over the data-parallel group and updates the rows (or ``discard`` drops them when the network's step
was skipped), and ``state_dict`` / ``load_state_dict`` hold everything a checkpoint needs. The model reaches a store
through ``TableLookup`` modules (launcher/tables/lookup.py) that stand where its nn.Embedding / nn.EmbeddingBag were.

``ReplicatedTables`` (replicated.py) keeps a whole copy of each table on every data-parallel rank, as MindSpore's
host EmbeddingLookup does; a store that shards rows over ranks (a parameter server) implements the same protocol.
A store may also gather the next micro-batches' rows ahead (``start_prefetch``, ``prefetch``, ``drop_prefetch``:
placement.prefetch, launcher/tables/prefetch.py): the replicated store does for its host tables, the sharded one
does not (its lookups are collectives on the training thread).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class TableStore(Protocol):
    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of table ``name`` on the compute device, shaped ids.shape + (dim,)."""

    def collect(self, grad_scale: float = 1.0) -> None:
        """After a backward: keep the looked-up rows' gradients, divided by ``grad_scale`` (an fp16 loss scale)."""

    def step(self) -> bool:
        """Exchange the kept gradients over the data-parallel group and update those rows (collective: every rank
        calls it every step). False when nothing was updated (the gradients were not finite)."""

    def discard(self) -> None:
        """Drop the kept gradients (the network skipped its step)."""

    def set_lr(self, name: str, lr: float) -> None:
        """Table ``name``'s learning rate from its next step on (an LR schedule)."""

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer states, by table name (references to the live tensors)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def digests(self) -> dict[str, str]:
        """A hash of each table's weights (equal on every rank that holds a copy)."""

    def held(self) -> dict[str, tuple[str, torch.Tensor, list[torch.Tensor]]]:
        """Per table this rank holds: (where the plan put it: host or device, its weight or this rank's rows of it,
        its optimizer's state tensors): what the memory accounting measures."""


class Stores:
    """Several stores as one (replicated tables beside sharded ones): lookups go to the store that holds the table;
    collect, step and discard go to every store, in one fixed order (their exchanges are collectives)."""

    huge_pages = None
    """The background collapse of the host tables' pages (launcher/tables/hugepages.Backing), once build_tables
    started it."""

    def __init__(self, stores: list[Any]) -> None:
        self.stores = stores
        self.tables = {name: t for s in stores for name, t in s.tables.items()}
        self._of = {name: s for s in stores for name in s.tables}

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        return self._of[name].lookup(name, ids)

    def collect(self, grad_scale: float = 1.0) -> None:
        for s in self.stores:
            s.collect(grad_scale)

    def step(self) -> bool:
        return all([s.step() for s in self.stores])  # a list: every store steps (each skips on its own)

    def discard(self) -> None:
        for s in self.stores:
            s.discard()

    def set_lr(self, name: str, lr: float) -> None:
        self._of[name].set_lr(name, lr)

    # prefetch (placement.prefetch): the stores that have it (replicated host tables); the others look up as usual
    def start_prefetch(self) -> list[str]:
        return sorted(n for s in self.stores if hasattr(s, "start_prefetch") for n in s.start_prefetch())

    def prefetch(self, lookups: list[tuple[str, torch.Tensor]], gather: bool = True) -> None:
        for s in self.stores:
            if hasattr(s, "prefetch"):
                s.prefetch(lookups, gather)

    def drop_prefetch(self, stop: bool = False) -> None:
        for s in self.stores:
            if hasattr(s, "drop_prefetch"):
                s.drop_prefetch(stop)

    def prefetch_stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stores:
            for k, v in (s.prefetch_stats() if hasattr(s, "prefetch_stats") else {}).items():
                out[k] = out.get(k, 0) + v
        return out

    def state_dict(self) -> dict[str, Any]:
        return {k: v for s in self.stores for k, v in s.state_dict().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for s in self.stores:
            s.load_state_dict({name: state[name] for name in s.tables})

    def digests(self) -> dict[str, str]:
        return {k: v for s in self.stores for k, v in s.digests().items()}

    def held(self) -> dict[str, tuple[str, torch.Tensor, list[torch.Tensor]]]:
        return {k: v for s in self.stores for k, v in s.held().items()}
