"""``TableLookup``: what stands where a model's ``nn.Embedding`` / ``nn.EmbeddingBag`` was once its table trains in a
table store, and ``build_tables``, which makes the swap (the model's own code does not change)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from launcher.parallel.rank import held_module, set_module

from launcher.plan import TablePlan
from launcher.tables.partition import RowPartition
from launcher.tables.replicated import ReplicatedTables
from launcher.tables.sharded import ShardedTables
from launcher.tables.store import Stores, TableStore


class TableLookup(nn.Module):
    """Stands in for an ``nn.Embedding`` or ``nn.EmbeddingBag`` whose table lives in a TableStore: same call, same
    result, no parameters."""

    def __init__(self, tables: TableStore, name: str, bag_mode: str | None = None,
                 include_last_offset: bool = False) -> None:
        super().__init__()
        self._tables = [tables]  # a list: not a submodule, not in state_dict
        self.name, self.bag_mode, self.include_last_offset = name, bag_mode, include_last_offset

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        rows = self._tables[0].lookup(self.name, ids)
        if self.bag_mode is None:
            return rows
        # EmbeddingBag: reduce the looked-up rows per bag on the compute device; each looked-up row is its own
        # "table row" here, so the gradient comes back per lookup, as from nn.Embedding.
        flat = rows.reshape(-1, rows.shape[-1])
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError("if input is 2D, then offsets has to be None (as nn.EmbeddingBag says)")
            offsets = torch.arange(0, ids.numel(), ids.shape[1], device=flat.device)
        index = torch.arange(flat.shape[0], device=flat.device)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1).to(flat.device, flat.dtype)
        return F.embedding_bag(index, flat, offsets.to(flat.device), mode=self.bag_mode,
                               per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset)

    def extra_repr(self) -> str:
        t = self._tables[0].tables[self.name]
        return f"{self.name}: {t.plan.rows}x{t.plan.dim} on {t.plan.location}, {t.plan.optimizer}"


def movable(m: nn.Module) -> str:
    """Why module ``m`` cannot be swapped for a TableLookup ('' when it can): the lookup reproduces nn.Embedding's
    forward and backward and nn.EmbeddingBag's, not their extras."""
    if not isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
        return f"it is a {type(m).__name__}, not an nn.Embedding or nn.EmbeddingBag"
    if not m.weight.requires_grad:
        return "its weight is frozen (requires_grad=False)"
    if m.max_norm is not None:
        return "it renormalises rows (max_norm)"
    if m.scale_grad_by_freq:
        return "it scales gradients by id frequency (scale_grad_by_freq)"
    if isinstance(m, nn.EmbeddingBag) and m.padding_idx is not None:
        return "an EmbeddingBag with padding_idx"
    return ""


def take_blocks(model: nn.Module, plans: tuple[TablePlan, ...], rank: int, size: int) -> dict[str, torch.Tensor]:
    """Right after the model is built: this rank's block of each sharded table it holds (a copy), the module's whole
    weight replaced by a meta tensor of its shape, so that the whole table is freed at once (build_tables then
    takes the blocks)."""
    blocks = {}
    for p in plans:
        module = held_module(model, p.name) if p.shards > 1 else None
        if module is None or movable(module) or module.weight.is_meta:
            continue  # not this model's, or build_tables says why it cannot move
        blocks[p.name] = RowPartition(p.rows, size).block_of(module.weight, rank)
        module.weight = nn.Parameter(torch.empty(module.weight.shape, device="meta"))
    return blocks


def build_tables(models: list[nn.Module], plans: tuple[TablePlan, ...], compute: torch.device, dtype: torch.dtype,
                 dp_group=None, ps_group=None, ps_mesh=None,
                 blocks: dict[str, torch.Tensor] | None = None) -> TableStore | None:
    """Take each planned table that ``models`` hold (by module path: a rank's pipeline stages, or the whole model)
    out of them: its weight moves into a table store, where the plan puts it (a whole copy in a ReplicatedTables
    store; this rank's block of rows in a ShardedTables store over ``ps_group`` when the plan shards it), and a
    TableLookup takes the module's place. ``blocks``: the sharded tables' blocks take_blocks already took. The
    models are changed in place; None when they hold none of the tables."""
    found = [(m, p, mod) for m in models for p in plans if (mod := held_module(m, p.name)) is not None]
    if not found:
        return None
    for _, p, module in found:
        why = movable(module)
        if why:
            raise TypeError(f"{p.name} cannot train outside the parallel parts: {why}. Set "
                            f"tables.{p.name}.optimizer=dense (it then trains with the rest of the model).")
    weights = {p.name: mod.weight for _, p, mod in found}
    padding = {p.name: mod.padding_idx for _, p, mod in found}
    replicated = tuple(p for _, p, _ in found if p.shards == 1)
    sharded = tuple(p for _, p, _ in found if p.shards > 1)
    stores: list[TableStore] = []
    if replicated:
        stores.append(ReplicatedTables(weights, replicated, compute, dtype, dp_group, padding))
    if sharded:
        stores.append(ShardedTables(weights, sharded, compute, dtype, ps_group, ps_mesh, padding, blocks))
    store = stores[0] if len(stores) == 1 else Stores(stores)
    for model, p, module in found:
        bag = module.mode if isinstance(module, nn.EmbeddingBag) else None
        lookup = TableLookup(store, p.name, bag, getattr(module, "include_last_offset", False))
        set_module(model, p.name, lookup)
    return store
