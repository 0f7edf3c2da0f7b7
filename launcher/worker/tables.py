"""Embedding tables trained outside the engine, on the host or the device, with row-sparse optimizers.

Per micro-batch: ``lookup`` gathers the batch's rows where the table lives and sends them to the compute device as
leaves that require grad; after the engine's backward ``collect_grads`` keeps (rows, d loss / d rows), unscaled by
the engine's loss scale (fp16). At the accumulation boundary ``step`` averages those sparse gradients over the
data-parallel group and updates only those rows, where the table lives; when the engine skipped its step (an fp16
overflow) ``discard`` drops them instead, so tables and network skip together; ``step`` also skips by itself when
the tables' own reduced gradients are not finite. Tables stay fp32 whatever the training precision.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import get_class
from torch import nn

from launcher.plan import TablePlan
from launcher.plan.registry import TABLE_OPTIMIZERS
from launcher.worker.sparse_comm import allreduce_sparse_mean
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


class TableSet:
    def __init__(self, model_tables: nn.ModuleDict, plans: tuple[TablePlan, ...], compute: torch.device,
                 dp_group=None) -> None:
        self.compute = compute
        self.dp_group = dp_group
        self.tables: dict[str, Table] = {}
        for p in plans:
            where = HOST if p.location == "host" else compute
            weight = model_tables[p.name].weight.detach().to(where).float().contiguous()
            self.tables[p.name] = Table(p, weight, build_table_optimizer(p, weight))
        # Tables looked up with the same row ids (Wide&Deep's two tables) share one coalesce and one all-gather:
        # their gradients travel side by side as the columns of one (rows, dim_a + dim_b) tensor.
        self._pending: list[tuple[tuple[str, ...], torch.Tensor, list[torch.Tensor]]] = []
        self._grads: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.skipped_steps = 0
        """Steps whose table gradients overflowed (nothing was updated)."""

    def lookup(self, rows_by_table: dict[str, torch.Tensor], dtype: torch.dtype, train: bool = True) -> dict[str, torch.Tensor]:
        """The rows of each table, on the compute device in the training dtype (leaves requiring grad if train)."""
        out: dict[str, torch.Tensor] = {}
        groups: dict[int, tuple[torch.Tensor, list[str]]] = {}
        for name, rows in rows_by_table.items():
            t = self.tables[name]
            act = host_to_device(t.weight[rows.to(t.weight.device)], self.compute, dtype)
            if train:
                act.requires_grad_()
            groups.setdefault(id(rows), (rows, []))[1].append(name)
            out[name] = act
        if train:
            for rows, names in groups.values():
                self._pending.append((tuple(names), rows, [out[n] for n in names]))
        return out

    def collect_grads(self, loss_scale: float = 1.0) -> None:
        """After backward: keep each lookup's gradient as (rows, values / loss_scale) on the compute device."""
        for names, rows, acts in self._pending:
            values = torch.cat([a.grad.reshape(-1, self.tables[n].plan.dim).float() for n, a in zip(names, acts)], dim=1)
            if loss_scale != 1.0:
                values.div_(loss_scale)
            self._grads.setdefault(names, []).append((rows.reshape(-1).to(self.compute), values))
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
        for names, rows, values in reduced:
            start = 0
            for name in names:
                t = self.tables[name]
                grads = values[:, start : start + t.plan.dim]
                start += t.plan.dim
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
