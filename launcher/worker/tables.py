"""Embedding tables trained outside the DeepSpeed engine, on the host or the device, with row-sparse optimizers.

Per micro-batch: ``lookup`` gathers the batch's rows where the table lives and sends them to the compute device as
leaves that require grad; after ``engine.backward`` ``collect_grads`` keeps (rows, d loss / d rows). At the
accumulation boundary ``step`` averages those sparse gradients over the data-parallel ranks and updates only those
rows, where the table lives. Tables stay fp32 whatever the training precision.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from launcher.plan import TablePlan
from launcher.worker.sparse_comm import allreduce_sparse_mean
from launcher.worker.sparse_optim import LazyAdam, SparseAdam, SparseFTRL
from launcher.worker.transfer import device_to_host, host_to_device

HOST = torch.device("cpu")


@dataclass
class Table:
    plan: TablePlan
    weight: torch.Tensor
    optimizer: LazyAdam | SparseAdam | SparseFTRL


class TableSet:
    def __init__(self, model_tables: nn.ModuleDict, plans: tuple[TablePlan, ...], compute: torch.device) -> None:
        self.compute = compute
        self.tables: dict[str, Table] = {}
        for p in plans:
            where = HOST if p.location == "host" else compute
            weight = model_tables[p.name].weight.detach().to(where).float().contiguous()
            if p.optimizer == "ftrl":
                opt = SparseFTRL(weight, p.lr, p.l1, p.l2, p.lr_power, p.initial_accumulator)
            elif p.optimizer == "sparse_adam":
                opt = SparseAdam(weight, p.lr, p.betas, p.eps)
            else:
                opt = LazyAdam(weight, p.lr, p.betas, p.eps)
            self.tables[p.name] = Table(p, weight, opt)
        # Tables looked up with the same row ids (Wide&Deep's two tables) share one coalesce and one all-gather:
        # their gradients travel side by side as the columns of one (rows, dim_a + dim_b) tensor.
        self._pending: list[tuple[tuple[str, ...], torch.Tensor, list[torch.Tensor]]] = []
        self._grads: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}

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

    def collect_grads(self) -> None:
        """After backward: keep each lookup's gradient as (rows, values) on the compute device."""
        for names, rows, acts in self._pending:
            values = torch.cat([a.grad.reshape(-1, self.tables[n].plan.dim).float() for n, a in zip(names, acts)], dim=1)
            self._grads.setdefault(names, []).append((rows.reshape(-1).to(self.compute), values))
        self._pending.clear()

    def step(self) -> None:
        """Average the sparse gradients over ranks (collective: every rank calls it) and update those rows."""
        for names in sorted(self._grads):  # the same groups in the same order on every rank
            parts = self._grads[names]
            rows, values = allreduce_sparse_mean(torch.cat([r for r, _ in parts]), torch.cat([v for _, v in parts]))
            start = 0
            for name in names:
                t = self.tables[name]
                grads = values[:, start : start + t.plan.dim]
                start += t.plan.dim
                t.optimizer.step(rows.to(t.weight.device), device_to_host(grads, t.weight.device).contiguous())
        self._grads.clear()

    def digests(self) -> dict[str, str]:
        """sha256 of each table's bytes: equal on every rank when data-parallel copies stay in sync."""
        return {name: hashlib.sha256(t.weight.cpu().numpy().tobytes()).hexdigest() for name, t in self.tables.items()}

    def save(self, path: Path) -> None:
        """Tables and their optimizer states (identical on every rank: rank 0 writes them)."""
        torch.save(
            {name: {"weight": t.weight, "state": t.optimizer.state_tensors()} for name, t in self.tables.items()}, path
        )
