"""The replicated table store: every data-parallel rank holds a whole copy of each of its tables, on the host or the
device, trained with a row-sparse optimizer (MindSpore's host ``EmbeddingLookup``, generalised to any model's
``nn.Embedding`` / ``nn.EmbeddingBag``).

In the forward, ``lookup`` gathers the batch's rows where the table lives and hands them to the compute device as a
leaf that requires grad; after each backward ``collect`` keeps (rows, d loss / d rows), unscaled by the engine's
loss scale (fp16). At the step boundary ``step`` averages those sparse gradients over the data-parallel group in one
fixed exchange (launcher/tables/sparse_comm.py: every rank issues the same collectives every step, also when its
batch missed a table) and updates only those rows, where the table lives; ``discard`` drops them when the network
skipped its step (an fp16 overflow), and ``step`` skips by itself when the reduced gradients are not finite. Tables
stay fp32 whatever the training precision. A pipeline rank's store holds the tables of its stages; with tensor
parallel the tp ranks of a dp group hold identical copies (they see the same data).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import get_class

from launcher.plan import TablePlan
from launcher.plan.registry import TABLE_OPTIMIZERS
from launcher.tables.sparse_comm import coalesce, reduce_tables
from launcher.tables.transfer import device_to_host, host_to_device

HOST = torch.device("cpu")


DIGEST_CHUNK = 1 << 24
"""Values hashed at a time: a table is never copied whole to hash it (a 1.7 GB table made the run's peak 1.2 GB
higher at its end, when each rank wrote tables.json)."""


def table_digest(weight: torch.Tensor) -> str:
    """sha256 of a table's bytes (row-major fp32), read in chunks of DIGEST_CHUNK values, each copied to the host
    only if it lives on a device."""
    h = hashlib.sha256()
    flat = weight.detach().reshape(-1)
    for start in range(0, flat.numel(), DIGEST_CHUNK):
        h.update(flat[start:start + DIGEST_CHUNK].cpu().contiguous().numpy())
    return h.hexdigest()


def row_grads(grad: torch.Tensor, ids: torch.Tensor, dim: int, padding_idx: int | None,
              grad_scale: float) -> torch.Tensor:
    """A lookup's gradient as (looked-up ids, dim) fp32 rows: the padding_idx rows at 0 (torch's embedding backward
    leaves them so), divided by an fp16 loss scale."""
    g = grad.float().reshape(-1, dim)
    if padding_idx is not None:
        g = g.masked_fill((ids.reshape(-1) == padding_idx).to(g.device).unsqueeze(1), 0.0)
    return g / grad_scale if grad_scale != 1.0 else g


def build_table_optimizer(p: TablePlan, weight: torch.Tensor) -> Any:
    """The row-sparse optimizer the registry names for p.optimizer (the planner refused unknown names)."""
    spec = TABLE_OPTIMIZERS[p.optimizer]
    return get_class(spec.impl)(weight, *(getattr(p, a) for a in spec.kwargs))


@dataclass
class Table:
    plan: TablePlan
    weight: torch.Tensor
    optimizer: Any
    """LazyAdam, SparseAdam, SparseFTRL or SparseSGD: step(rows, grads), lr, state_tensors(), state_dict()."""
    padding_idx: int | None = None
    """nn.Embedding's padding_idx: that row gets no gradient."""


class ReplicatedTables:
    def __init__(self, weights: dict[str, torch.Tensor], plans: tuple[TablePlan, ...], compute: torch.device,
                 dtype: torch.dtype = torch.float32, dp_group=None, padding: dict[str, int | None] | None = None) -> None:
        self.compute, self.dtype, self.dp_group = compute, dtype, dp_group
        self.tables: dict[str, Table] = {}
        for p in sorted(plans, key=lambda p: p.name):  # one order on every rank: the exchange's
            where = HOST if p.location == "host" else compute
            weight = weights[p.name].detach().to(where).float().contiguous()
            self.tables[p.name] = Table(p, weight, build_table_optimizer(p, weight), (padding or {}).get(p.name))
        # Tables looked up with the same ids tensor in one forward (Wide&Deep's two tables) coalesce together and
        # travel side by side: their gradients are the columns of one (rows, dim_a + dim_b) tensor.
        self._pending: list[tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]] = []
        self._grads: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.skipped_steps = 0
        """Steps whose table gradients were not finite (nothing was updated)."""

    def set_lr(self, name: str, lr: float) -> None:
        self.tables[name].optimizer.lr = lr

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        t = self.tables[name]
        rows = torch.index_select(t.weight, 0, ids.reshape(-1).to(t.weight.device))  # 4.6x weight[ids] at dim 16
        act = host_to_device(rows, self.compute, self.dtype)
        if torch.is_grad_enabled():
            act.requires_grad_()
            group = next((g for g in self._pending if g[0] is ids and all(n != name for n, _ in g[1])), None)
            if group is None:  # a new ids tensor, or this table looked up twice with the same ids
                group = (ids, [])
                self._pending.append(group)
            group[1].append((name, act))
        return act.view(*ids.shape, t.plan.dim)

    def collect(self, grad_scale: float = 1.0) -> None:
        """Lookups the loss did not reach (no gradient) are dropped."""
        for ids, looked_up in self._pending:
            looked_up = [(n, a) for n, a in looked_up if a.grad is not None]
            if not looked_up:
                continue
            rows = ids.reshape(-1).to(self.compute, torch.int64)  # int32 ids too: every rank sends int64 rows
            values = torch.cat([row_grads(a.grad, rows, self.tables[n].plan.dim, self.tables[n].padding_idx,
                                          grad_scale) for n, a in looked_up], dim=1)  # (n, dim_a + dim_b ...)
            self._grads.setdefault(tuple(n for n, _ in looked_up), []).append((rows, values))
        self._pending.clear()

    def _local(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor] | None], list[int]]:
        """This rank's coalesced gradient of each table (None: none), and which earlier table each shares its rows
        with (tables that were always looked up together: one coalesce)."""
        names = list(self.tables)
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        shares = [-1] * len(names)
        for group, entries in self._grads.items():
            rows, values = coalesce(torch.cat([r for r, _ in entries]), torch.cat([v for _, v in entries]))
            start = 0
            for name in group:
                dim = self.tables[name].plan.dim
                parts.setdefault(name, []).append((rows, values[:, start:start + dim]))
                start += dim
        for group in self._grads:
            root = names.index(group[0])
            for name in group[1:]:
                if len(parts[name]) == 1 and len(parts[group[0]]) == 1:
                    shares[names.index(name)] = root
        local = []
        for name in names:
            got = parts.get(name)
            if got is None:
                local.append(None)
            elif len(got) == 1:
                local.append((got[0][0], got[0][1].contiguous()))
            else:  # looked up in several groups: one gradient per table
                local.append(coalesce(torch.cat([r for r, _ in got]), torch.cat([v for _, v in got])))
        self._grads.clear()
        return local, shares

    def step(self) -> bool:
        local, shares = self._local()
        dims = [t.plan.dim for t in self.tables.values()]
        reduced = reduce_tables(local, dims, shares, group=self.dp_group, device=self.compute)
        if not all(bool(torch.isfinite(r[1]).all()) for r in reduced if r is not None):
            self.skipped_steps += 1  # the same reduced values on every rank: every rank decides the same
            return False
        for t, r in zip(self.tables.values(), reduced):
            if r is not None:
                rows, grads = r
                t.optimizer.step(rows.to(t.weight.device), device_to_host(grads, t.weight.device).contiguous())
        return True

    def discard(self) -> None:
        self._pending.clear()
        self._grads.clear()

    def digests(self) -> dict[str, str]:
        return {name: table_digest(t.weight) for name, t in self.tables.items()}

    def held(self) -> dict[str, tuple[str, torch.Tensor, list[torch.Tensor]]]:
        return {name: (t.plan.location, t.weight, t.optimizer.state_tensors()) for name, t in self.tables.items()}

    def state_dict(self) -> dict[str, Any]:
        """Each table's weights and its optimizer's state, step counts included (identical on every rank).
        References to the live tensors, as torch's state_dict gives: no copy of a large table just to save it."""
        return {name: {"weight": t.weight, "optimizer": t.optimizer.state_dict()} for name, t in self.tables.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, t in self.tables.items():
            t.weight.copy_(state[name]["weight"])
            t.optimizer.load_state_dict(state[name]["optimizer"])
