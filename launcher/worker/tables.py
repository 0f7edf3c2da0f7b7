"""Embedding tables trained outside the engine, on the host or the device, with row-sparse optimizers: MindSpore's
host ``EmbeddingLookup``, generalised to any model's ``nn.Embedding`` / ``nn.EmbeddingBag``.

``build_tables`` swaps each planned table of a plain model for a ``TableLookup`` module at the same path. In the
forward it gathers the batch's rows where the table lives and hands them to the compute device as a leaf that
requires grad (the model's own code does not change); after the engine's backward ``collect_grads`` keeps (rows,
d loss / d rows), unscaled by the engine's loss scale (fp16). At the accumulation boundary ``step`` averages those
sparse gradients over the data-parallel group and updates only those rows, where the table lives; when the engine
skipped its step (an fp16 overflow) ``discard`` drops them instead, so tables and network skip together; ``step``
also skips by itself when the tables' own reduced gradients are not finite. Tables stay fp32 whatever the training
precision. The engine never sees the tables: a ``TableLookup`` has no parameters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from torch import nn

from launcher.plan import TablePlan
from launcher.plan.registry import TABLE_OPTIMIZERS
from launcher.worker.sparse_comm import allreduce_sparse_mean, coalesce
from launcher.worker.transfer import device_to_host, host_to_device

HOST = torch.device("cpu")


def build_table_optimizer(p: TablePlan, weight: torch.Tensor) -> Any:
    """The row-sparse optimizer the registry names for p.optimizer (the planner refused unknown names)."""
    spec = TABLE_OPTIMIZERS[p.optimizer]
    return get_class(spec.impl)(weight, *(getattr(p, a) for a in spec.kwargs))


@dataclass
class Table:
    plan: TablePlan
    weight: torch.Tensor
    optimizer: Any
    """LazyAdam, SparseAdam or SparseFTRL: step(rows, grads), state_tensors(), state_dict()."""
    padding_idx: int | None = None
    """nn.Embedding's padding_idx: that row gets no gradient."""


class TableSet:
    def __init__(self, weights: dict[str, torch.Tensor], plans: tuple[TablePlan, ...], compute: torch.device,
                 dtype: torch.dtype = torch.float32, dp_group=None, padding: dict[str, int | None] | None = None) -> None:
        self.compute, self.dtype, self.dp_group = compute, dtype, dp_group
        self.tables: dict[str, Table] = {}
        for p in plans:
            where = HOST if p.location == "host" else compute
            weight = weights[p.name].detach().to(where).float().contiguous()
            self.tables[p.name] = Table(p, weight, build_table_optimizer(p, weight), (padding or {}).get(p.name))
        # Tables looked up with the same row ids in one forward (Wide&Deep's two tables) share one coalesce and one
        # all-gather: their gradients travel side by side as the columns of one (rows, dim_a + dim_b) tensor.
        self._pending: list[tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]] = []
        self._grads: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.skipped_steps = 0
        """Steps whose table gradients overflowed (nothing was updated)."""

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids`` of table ``name`` on the compute device in the training dtype, shaped ids.shape + (dim,).
        With autograd on, a leaf that requires grad, collected after backward."""
        t = self.tables[name]
        act = host_to_device(t.weight[ids.reshape(-1).to(t.weight.device)], self.compute, self.dtype)
        if torch.is_grad_enabled():
            act.requires_grad_()
            group = next((g for g in self._pending if g[0] is ids and all(n != name for n, _ in g[1])), None)
            if group is None:  # a new ids tensor, or this table looked up twice with the same ids
                group = (ids, [])
                self._pending.append(group)
            group[1].append((name, act))
        return act.view(*ids.shape, t.plan.dim)

    def collect_grads(self, loss_scale: float = 1.0) -> None:
        """After backward: keep each lookup's gradient as (rows, values / loss_scale) on the compute device.
        Lookups the loss did not reach (no gradient) are dropped."""
        for ids, looked_up in self._pending:
            looked_up = [(n, a) for n, a in looked_up if a.grad is not None]
            if not looked_up:
                continue
            rows = ids.reshape(-1).to(self.compute)
            values = torch.cat([a.grad.float() for _, a in looked_up], dim=1)  # (n, dim_a + dim_b ...)
            start = 0
            for name, _ in looked_up:
                t = self.tables[name]
                if t.padding_idx is not None:  # torch's embedding backward leaves the padding row's gradient at 0
                    values[rows == t.padding_idx, start : start + t.plan.dim] = 0.0
                start += t.plan.dim
            if loss_scale != 1.0:
                values.div_(loss_scale)
            self._grads.setdefault(tuple(n for n, _ in looked_up), []).append((rows, values))
        self._pending.clear()

    def step(self) -> bool:
        """Average the sparse gradients over the dp group (collective: every rank calls it) and update those rows.
        Returns False, updating nothing, when a reduced gradient is not finite (an fp16 overflow in the looked-up
        rows, which the engine's own overflow check does not see); the reduced values are the same on every rank,
        so every rank decides the same."""
        reduced = []
        for names in sorted(self._grads):  # the same groups in the same order on every rank
            parts = self._grads[names]
            rows, values = allreduce_sparse_mean(torch.cat([r for r, _ in parts]), torch.cat([v for _, v in parts]),
                                                 group=self.dp_group)
            reduced.append((names, rows, values))
        self._grads.clear()
        if not all(bool(torch.isfinite(v).all()) for _, _, v in reduced):
            self.skipped_steps += 1
            return False
        per_table: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for names, rows, values in reduced:
            start = 0
            for name in names:
                dim = self.tables[name].plan.dim
                per_table.setdefault(name, []).append((rows, values[:, start : start + dim]))
                start += dim
        for name, parts in per_table.items():  # one optimizer step per table, however many lookups it had
            rows, grads = parts[0] if len(parts) == 1 else coalesce(torch.cat([r for r, _ in parts]),
                                                                     torch.cat([g for _, g in parts]))
            t = self.tables[name]
            t.optimizer.step(rows.to(t.weight.device), device_to_host(grads, t.weight.device).contiguous())
        return True

    def discard(self) -> None:
        """Drop this step's gradients (the engine skipped its step)."""
        self._pending.clear()
        self._grads.clear()

    def digests(self) -> dict[str, str]:
        """sha256 of each table's bytes: equal on every rank when data-parallel copies stay in sync."""
        return {name: hashlib.sha256(t.weight.cpu().numpy().tobytes()).hexdigest() for name, t in self.tables.items()}

    def state_dict(self) -> dict[str, Any]:
        """Each table's weights and its optimizer's state, step counts included (identical on every rank).
        References to the live tensors, as torch's state_dict gives: no copy of a large table just to save it."""
        return {name: {"weight": t.weight, "optimizer": t.optimizer.state_dict()} for name, t in self.tables.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, t in self.tables.items():
            t.weight.copy_(state[name]["weight"])
            t.optimizer.load_state_dict(state[name]["optimizer"])


class TableLookup(nn.Module):
    """Stands in for an ``nn.Embedding`` or ``nn.EmbeddingBag`` whose table lives in a TableSet: same call, same
    result, no parameters."""

    def __init__(self, tables: TableSet, name: str, bag_mode: str | None = None,
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


def build_tables(model: nn.Module, plans: tuple[TablePlan, ...], compute: torch.device, dtype: torch.dtype,
                 dp_group=None) -> TableSet:
    """Take each planned table (by module path) out of ``model``: its weight moves into a TableSet, where the plan
    puts it, and a TableLookup takes the module's place. The model is changed in place."""
    modules = {p.name: model.get_submodule(p.name) for p in plans}
    for name, m in modules.items():
        why = movable(m)
        if why:
            raise TypeError(f"{name} cannot train outside the engine: {why}")
    padding = {n: m.padding_idx for n, m in modules.items()}
    tables = TableSet({n: m.weight for n, m in modules.items()}, plans, compute, dtype, dp_group, padding)
    for name, m in modules.items():
        bag = m.mode if isinstance(m, nn.EmbeddingBag) else None
        lookup = TableLookup(tables, name, bag, getattr(m, "include_last_offset", False))
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, lookup)
    return tables
