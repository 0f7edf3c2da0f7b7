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

from launcher.plan.placement import TablePlan
from launcher.plan.registry import TABLE_OPTIMIZERS
import launcher.tables.kernels as kernels
from launcher.tables.prefetch import Ahead
from launcher.tables.sparse_comm import coalesce, coalesce_all, group_size, reduce_tables
from launcher.tables.row_update import RowUpdate, step_all, updates_all
from launcher.tables.transfer import device_to_host, gather_to_device

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


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat, without its copy of a single part."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class Looked:
    """A tracked lookup's gradient, once the backward brought it (None: the loss did not reach those rows)."""

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


class ToStore(torch.autograd.Function):
    """Looked-up rows (``lookup``) or pooled bags (``pooled``) as the model sees them; the backward hands each part's
    lookup (``Looked``) its gradient: ``parts`` are (slot, first column, columns, bag lengths or None). No leaf whose
    ``.grad`` would be a copy: a strided slice of the model's gradient (the columns of a concatenation) is kept as it
    is, and the coalesce reads it in place; a bag of several ids gives each id its bag's row (an embedding bag's
    backward)."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, values: torch.Tensor, parts: list) -> torch.Tensor:  # noqa: ARG004
        ctx.parts = parts
        return values.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        for slot, col, dim, lengths in ctx.parts:
            g = grad[:, col:col + dim]
            g = g if lengths is None else g.repeat_interleave(lengths, dim=0)
            slot.grad = g if slot.grad is None else slot.grad + g  # a second backward through the same graph
        return None, None, None


@dataclass
class Table:
    plan: TablePlan
    weight: torch.Tensor
    optimizer: Any
    """LazyAdam, SparseAdam, SparseFTRL or SparseSGD: step(rows, grads), lr, state_tensors(), state_dict()."""
    padding_idx: int | None = None
    """nn.Embedding's padding_idx: that row gets no gradient."""


class ReplicatedTables:
    huge_pages = None
    """The background collapse of the host tables' pages (launcher/tables/hugepages.Backing), once build_tables
    started it."""

    def __init__(self, weights: dict[str, torch.Tensor], plans: tuple[TablePlan, ...], compute: torch.device,
                 dtype: torch.dtype = torch.float32, dp_group=None, padding: dict[str, int | None] | None = None) -> None:
        self.compute, self.dtype, self.dp_group = compute, dtype, dp_group
        self.tables: dict[str, Table] = {}
        for p in sorted(plans, key=lambda p: p.name):  # one order on every rank: the exchange's
            where = HOST if p.on_host else compute
            weight = weights[p.name].detach().to(where).float().contiguous()
            self.tables[p.name] = Table(p, weight, build_table_optimizer(p, weight), (padding or {}).get(p.name))
        # Tables looked up with the same ids tensor in one forward (Wide&Deep's two tables) coalesce together (one
        # sort of their rows) and share their rows in the exchange: a group keeps, per micro-batch, its rows and each
        # table's gradient. Each group also keeps the ids' (unique, inverse) when the prefetch thread computed them
        # (CPU): the coalesce needs no sort.
        self._pending: list[tuple[torch.Tensor, list[tuple[str, torch.Tensor]], list[Any]]] = []
        self._grads: dict[tuple[str, ...], list[tuple[torch.Tensor, list[torch.Tensor]]]] = {}
        self._known: dict[tuple[str, ...], Any] = {}
        """A group's (unique, inverse) from the prefetch, while it has one micro-batch's gradient."""
        self._anchor = torch.zeros((), requires_grad=True)
        """What every tracked lookup's rows hang from in the autograd graph (ToStore): no gradient reaches it."""
        self._ahead: Ahead | None = None
        """The prefetch queue of the host tables (placement.prefetch > 0: start_prefetch)."""
        self.skipped_steps = 0
        """Steps whose table gradients were not finite (nothing was updated)."""

    def set_lr(self, name: str, lr: float) -> None:
        self._settle()  # a queued update keeps the rate it was made with
        self.tables[name].optimizer.lr = lr

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        t = self.tables[name]
        served = self._ahead.take(name, ids) if self._ahead is not None and torch.is_grad_enabled() else None
        if served is None:
            if self._ahead is not None:
                self._ahead.settle()  # the last step's deferred row writes land first
            act, known = gather_to_device(t.weight, ids.reshape(-1), self.compute, self.dtype), None
        else:
            act, known = served
        if torch.is_grad_enabled():
            slot = Looked()
            act = ToStore.apply(self._anchor, act, [(slot, 0, t.plan.dim, None)])
            group = next((g for g in self._pending if g[0] is ids and all(n != name for n, _ in g[1])), None)
            if group is None:  # a new ids tensor, or this table looked up twice with the same ids
                group = (ids, [], [None])
                self._pending.append(group)
            group[1].append((name, slot))
            group[2][0] = group[2][0] or known
        return act.view(*ids.shape, t.plan.dim)

    def pooled(self, names: list[str], keys: list[int], ids: torch.Tensor, offsets: torch.Tensor,
               bags: int) -> torch.Tensor | None:
        """The sums of table ``names[f]``'s rows over each bag of key ``keys[f]`` of a KeyedJaggedTensor (its ``ids``,
        its ``offsets``, ``bags`` bags a key), side by side in one (bags, sum of dims) tensor, every table in one
        call (kernels.py ``pool_many``: a TorchRec EmbeddingBagCollection's forward, lookup.py batch_collections),
        tracked as ``lookup``'s rows are. None when the call is not one this store takes (prefetch on, a table or
        the compute device not the host's CPU, the kernels not loaded): the caller looks the tables up one by one."""
        if self._ahead is not None or self.compute.type != "cpu" or self.dtype != torch.float32:
            return None
        tables = [self.tables[n].weight for n in names]
        ids, offsets = ids.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
        if not kernels.usable(ids, offsets, *tables):
            return None
        out, single = kernels.pool_many(tables, keys, ids, offsets, bags)
        if not torch.is_grad_enabled():
            return out
        parts, col = [], 0
        for name, key, one in zip(names, keys, single):
            bounds = offsets[key * bags:(key + 1) * bags + 1]
            slot = Looked()
            self._pending.append((ids[int(bounds[0]):int(bounds[-1])], [(name, slot)], [None]))
            parts.append((slot, col, self.tables[name].plan.dim, None if one else bounds.diff()))
            col += self.tables[name].plan.dim
        return ToStore.apply(self._anchor, out, parts)

    def collect(self, grad_scale: float = 1.0) -> None:
        """Lookups the loss did not reach (no gradient) are dropped."""
        for ids, looked_up, known in self._pending:
            looked_up = [(n, a) for n, a in looked_up if a.grad is not None]
            if not looked_up:
                continue
            rows = ids.reshape(-1).to(self.compute, torch.int64)  # int32 ids too: every rank sends int64 rows
            grads = [row_grads(a.grad, rows, self.tables[n].plan.dim, self.tables[n].padding_idx, grad_scale)
                     for n, a in looked_up]
            group = tuple(n for n, _ in looked_up)
            self._known[group] = known[0] if group not in self._grads else None
            self._grads.setdefault(group, []).append((rows, grads))
        self._pending.clear()
        if self._ahead is not None:
            self._ahead.done()

    def _local(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor] | None], list[int], bool | None]:
        """This rank's coalesced gradient of each table (None: none), which earlier table each shares its rows
        with (tables that were always looked up together: one coalesce), and whether every value of them is finite
        where the coalesce's kernel call checked them all (False where it found one that is not; None: not all
        checked)."""
        names = list(self.tables)
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        shares = [-1] * len(names)
        each = []  # a group's tables with its one rows tensor: the kernels sort it once for all of them
        for group, entries in self._grads.items():
            rows = _cat([r for r, _ in entries])
            each += [(rows, _cat([g[j] for _, g in entries]), self._known.get(group)) for j in range(len(group))]
        coalesced, checked = coalesce_all(each)
        summed = iter(coalesced)
        for group in self._grads:
            for name in group:
                parts.setdefault(name, []).append(next(summed))
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
            else:  # looked up in several groups: one gradient per table (summed here, not checked)
                local.append(coalesce(torch.cat([r for r, _ in got]), torch.cat([v for _, v in got]),
                                      any_order=True))
                checked.append(None)
        self._grads.clear()
        self._known.clear()
        finite = False if False in checked else None if None in checked else True
        return local, shares, finite

    def step(self) -> bool:
        """With prefetch, a host table's update is computed here and written by the prefetch thread
        (launcher/tables/prefetch.py), the rows the queued micro-batches need first, then gathered for them."""
        local, shares, finite = self._local()
        dims = [t.plan.dim for t in self.tables.values()]
        reduced = reduce_tables(local, dims, shares, group=self.dp_group, device=self.compute)
        if finite is None or group_size(self.dp_group) > 1:  # (one rank: its sums are the reduced ones)
            finite = kernels.all_finite([r[1] for r in reduced if r is not None])
        if not finite:
            self.skipped_steps += 1  # the same reduced values on every rank: every rank decides the same
            return False
        self._settle()  # the last update's writes are in: this one reads those rows
        deferred, names, steps = [], [], []
        for name, t, r in zip(self.tables, self.tables.values(), reduced):
            if r is None:
                continue
            rows, grads = r[0].to(t.weight.device), device_to_host(r[1], t.weight.device).contiguous()
            if self._ahead is None or name not in self._ahead.tables or not isinstance(t.optimizer, RowUpdate):
                steps.append((t.optimizer, rows, grads))  # (torch's SparseAdam writes its step itself)
            else:
                deferred.append((t.optimizer, rows, grads))
                names.append(name)
        step_all(steps)  # the tables on the C kernels: one call per kernel
        if self._ahead is not None:  # computed here, written by the prefetch thread
            news = updates_all(deferred)
            self._ahead.update([(name, rows, new) for name, (_, rows, _), new in zip(names, deferred, news)])
        return True

    def discard(self) -> None:
        self._pending.clear()
        self._grads.clear()
        self._known.clear()

    # -- prefetch (placement.prefetch: launcher/tables/prefetch.py) ---------------------------------------------------
    def start_prefetch(self) -> list[str]:
        """Gather the host tables' rows of queued micro-batches ahead (``prefetch``); the tables it covers."""
        host = {name: t.weight for name, t in self.tables.items() if t.plan.on_host}
        if host and self._ahead is None:
            self._ahead = Ahead(host, self.compute, self.dtype)
        return sorted(host)

    def prefetch(self, lookups: list[tuple[str, torch.Tensor]], gather: bool = True) -> None:
        """Queue the next micro-batch's recorded lookups (launcher/tables/record.py); ``gather``: its rows now (no
        table update comes before its use; else the update gathers them)."""
        if self._ahead is not None:
            self._ahead.queue(lookups, gather)

    def drop_prefetch(self, stop: bool = False) -> None:
        if self._ahead is not None:
            self._ahead.drop()
            if stop:
                self._ahead.close()
                self._ahead = None

    def prefetch_stats(self) -> dict[str, int]:
        return dict(self._ahead.stats) if self._ahead is not None else {}

    def _settle(self) -> None:
        if self._ahead is not None:
            self._ahead.settle()

    # -- state ------------------------------------------------------------------------------------------------------
    def digests(self) -> dict[str, str]:
        self._settle()
        return {name: table_digest(t.weight) for name, t in self.tables.items()}

    def held(self) -> dict[str, tuple[str, torch.Tensor, list[torch.Tensor]]]:
        self._settle()
        return {name: (t.plan.location, t.weight, t.optimizer.state_tensors()) for name, t in self.tables.items()}

    def state_dict(self) -> dict[str, Any]:
        """Each table's weights and its optimizer's state, step counts included (identical on every rank).
        References to the live tensors, as torch's state_dict gives: no copy of a large table just to save it."""
        self._settle()
        return {name: {"weight": t.weight, "optimizer": t.optimizer.state_dict()} for name, t in self.tables.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drop_prefetch()  # deferred writes land before, and no queued row survives, the load
        for name, t in self.tables.items():
            t.weight.copy_(state[name]["weight"])
            t.optimizer.load_state_dict(state[name]["optimizer"])
