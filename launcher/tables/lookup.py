"""``TableLookup``: what stands where a model's ``nn.Embedding`` / ``nn.EmbeddingBag`` was once its table trains in a
table store, ``build_tables``, which makes the swap (the model's own code does not change), and
``batch_collections``, which gives a TorchRec EmbeddingBagCollection of such tables one lookup for all of them."""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from launcher.module_paths import held_module, set_module
from launcher.plan.placement import TablePlan
from launcher.tables import hugepages
from launcher.tables.hashing import HashStats, IdHash
from launcher.tables.partition import RowPartition
from launcher.tables.record import RECORDING
from launcher.tables.registry import STORES, StoreInputs, store_kind
from launcher.tables.store import Stores, TableStore


class TableLookup(nn.Module):
    """Stands in for an ``nn.Embedding`` whose table lives in a TableStore: the same call (``lookup(ids)`` or
    ``lookup(input=ids)``), the same result, no parameters. The replaced module's attributes (``num_embeddings``,
    ``embedding_dim``, ``padding_idx``, ...) are kept for code that reads them; its ``weight`` is in the store.
    ``hashing``: raw ids are hashed into rows first (``tables.<name>.hash``)."""

    def __init__(self, tables: TableStore, name: str, like: nn.Module, hashing: IdHash | None = None) -> None:
        super().__init__()
        self._tables = [tables]  # a list: not a submodule, not in state_dict
        self.name, self.hashing = name, hashing
        for attr in MIRRORED:
            if hasattr(like, attr):
                setattr(self, attr, getattr(like, attr))
        self.hash_stats = HashStats() if hashing is not None else None

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The table rows of ``ids`` (raw ids hashed when the table hashes them)."""
        if self.hashing is None:
            return ids
        rows = self.hashing(ids)
        if self.training and torch.is_grad_enabled():
            self.hash_stats.add(ids, rows)
        return rows

    def _lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """The store's rows, or while a recording pass runs (placement.prefetch: launcher/tables/record.py) the
        recorder's zeros."""
        recorder = RECORDING.get()
        if recorder is not None:
            return recorder.lookup(self.name, rows, self.embedding_dim)
        return self._tables[0].lookup(self.name, rows)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Embedding's own argument name)
        return self._lookup(self._rows(input))

    def extra_repr(self) -> str:
        t = self._tables[0].tables[self.name]
        hashed = f", ids hashed into {self.hashing.buckets} rows ({self.hashing.function})" if self.hashing else ""
        return f"{self.name}: {t.plan.rows}x{t.plan.dim} on {t.plan.location}, {t.plan.optimizer}{hashed}"


class BagLookup(TableLookup):
    """Stands in for an ``nn.EmbeddingBag``: ``forward(input, offsets=None, per_sample_weights=None)`` as torch's,
    positional or by keyword (TorchRec's EmbeddingBagCollection calls ``input=``, ``offsets=``,
    ``per_sample_weights=``): a 1-D input with offsets (``include_last_offset`` as the module had it) or a 2-D input
    of fixed-size bags, modes sum, mean and max, per-sample weights (sum), ``padding_idx`` (those entries leave their
    bag, as torch's). Each looked-up row is reduced into its bag on the compute device; its gradient comes back per
    lookup, as from nn.Embedding."""

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,  # noqa: A002
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        ids = self._rows(input)
        rows = self._lookup(ids)
        flat = rows.reshape(-1, rows.shape[-1])
        pooled = pool(flat, ids, offsets, per_sample_weights, self.mode, self.padding_idx, self.include_last_offset)
        if pooled is not None:
            return pooled
        index = torch.arange(flat.shape[0], device=flat.device).view(input.shape)
        padding = None
        if self.padding_idx is not None:  # its entries point at one zero row, which embedding_bag leaves out
            padding = flat.shape[0]
            index = index.masked_fill((ids == self.padding_idx).to(flat.device), padding)
            flat = torch.cat([flat, flat.new_zeros(1, flat.shape[1])])
        if offsets is not None:
            offsets = offsets.to(flat.device, torch.int64)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(flat.device, flat.dtype)
        return F.embedding_bag(index, flat, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=padding)


def pool(flat: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None, weights: torch.Tensor | None,
         mode: str, padding_idx: int | None, include_last_offset: bool) -> torch.Tensor | None:
    """Bags of already looked-up rows (``flat``: one row per id), sum or mean, as nn.EmbeddingBag pools them, by ops
    whose backward hands each looked-up row its bag's gradient (an expand or an index_select): no embedding-bag
    backward over rows that are gathered already (its sort and scatter were a quarter of a host-table step). None
    for a call this does not take (mode max, a shape or argument torch would refuse): F.embedding_bag then pools it,
    and refuses what torch refuses."""
    if mode not in ("sum", "mean") or (weights is not None and (mode != "sum" or weights.shape != ids.shape)):
        return None
    if ids.dim() == 2 and offsets is None:
        bags, size = ids.shape
        bag_of = None
    elif ids.dim() == 1 and offsets is not None and offsets.dim() == 1 and offsets.numel() > 0:
        ends = offsets.to(flat.device, torch.int64)
        if not include_last_offset:
            ends = torch.cat([ends, ends.new_tensor([ids.numel()])])
        lengths = ends.diff()
        if int(ends[0]) != 0 or int(ends[-1]) != ids.numel() or bool((lengths < 0).any()):
            return None  # torch's own checks and messages
        bags, size = len(lengths), None
        bag_of = torch.repeat_interleave(torch.arange(bags, device=flat.device), lengths)
    else:
        return None
    scale = None if weights is None else weights.to(flat.device, flat.dtype).reshape(-1)
    if padding_idx is not None:  # padding entries leave their bag (and its count)
        keep = (ids.reshape(-1) != padding_idx).to(flat.device)
        scale = keep.to(flat.dtype) if scale is None else scale * keep
    x = flat if scale is None else flat * scale.unsqueeze(1)
    if bag_of is None and size == 1:  # the rows themselves (a copy where they are a leaf: the model may change the
        out = x.view(bags, x.shape[1])  # output in place, which autograd refuses on a view of a leaf)
        base = out._base if out._base is not None else out
        if base.is_leaf and base.requires_grad:
            out = out.clone()
    elif bag_of is None:
        out = x.view(bags, size, x.shape[1]).sum(1)
    else:
        out = x.new_zeros(bags, x.shape[1]).index_add(0, bag_of, x)
    if mode == "mean":
        if padding_idx is not None:
            counts = keep.view(bags, size).sum(1) if bag_of is None else \
                torch.zeros(bags, dtype=torch.int64, device=flat.device).index_add_(0, bag_of, keep.long())
        else:
            counts = torch.full((bags,), size, device=flat.device) if bag_of is None else lengths
        out = out / counts.clamp(min=1).to(out.dtype).unsqueeze(1)
    return out


MIRRORED = ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
            "sparse", "mode", "include_last_offset")
"""Attributes of nn.Embedding / nn.EmbeddingBag a lookup keeps from the module it replaces."""


def lookup_for(store: Any, name: str, module: nn.Module, hashing: IdHash | None = None) -> TableLookup:
    """The lookup that stands where ``module`` (an nn.Embedding or nn.EmbeddingBag) was."""
    cls = BagLookup if isinstance(module, nn.EmbeddingBag) else TableLookup
    return cls(store, name, module, hashing)


def hashing_of(plan: TablePlan, module: nn.Module) -> IdHash | None:
    """The id hash a table's plan asks for (tables.<name>.hash), or None."""
    if not plan.hash_buckets:
        return None
    return IdHash(plan.hash_buckets, plan.hash_fn, module.padding_idx)


def hash_report(model: nn.Module) -> dict[str, dict[str, float | int]]:
    """{table: its HashStats} of the hashed lookups in ``model`` (a table looked up from several places: summed)."""
    out: dict[str, HashStats] = {}
    for m in model.modules():
        if isinstance(m, TableLookup) and m.hash_stats is not None:
            s = out.setdefault(m.name, HashStats())
            s.ids, s.distinct, s.rows, s.batches = (s.ids + m.hash_stats.ids, s.distinct + m.hash_stats.distinct,
                                                    s.rows + m.hash_stats.rows, s.batches + m.hash_stats.batches)
    return {name: s.to_dict() for name, s in out.items()}


def movable(m: nn.Module) -> str:
    """Why module ``m`` cannot be swapped for a TableLookup ('' when it can): the lookup reproduces nn.Embedding's
    forward and backward and nn.EmbeddingBag's, not their extras."""
    if not isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
        return f"it is a {type(m).__name__}, not an nn.Embedding or nn.EmbeddingBag"
    base = nn.EmbeddingBag if isinstance(m, nn.EmbeddingBag) else nn.Embedding
    if type(m).forward is not base.forward:  # e.g. an embedding that scales its rows: the lookup would drop that
        return f"its class {type(m).__name__} has a forward of its own (the lookup reproduces {base.__name__}'s)"
    if not m.weight.requires_grad:
        return "its weight is frozen (requires_grad=False)"
    if m.max_norm is not None:
        return "it renormalises rows (max_norm)"
    if m.scale_grad_by_freq:
        return "it scales gradients by id frequency (scale_grad_by_freq)"
    return ""


def take_blocks(model: nn.Module, plans: tuple[TablePlan, ...], rank: int, size: int) -> dict[str, torch.Tensor]:
    """Right after the model is built: this rank's block of each sharded table it holds (a copy), the module's whole
    weight replaced by a meta tensor of its shape, so that the whole table is freed at once (build_tables then
    takes the blocks)."""
    blocks = {}
    for p in plans:
        module = held_module(model, p.name) if p.sharded else None
        if module is None or movable(module) or module.weight.is_meta:
            continue  # not this model's, or build_tables says why it cannot move
        blocks[p.name] = RowPartition(p.rows, size).block_of(module.weight, rank)
        module.weight = nn.Parameter(torch.empty(module.weight.shape, device="meta"))
    return blocks


def build_tables(models: list[nn.Module], plans: tuple[TablePlan, ...], compute: torch.device, dtype: torch.dtype,
                 dp_group=None, ps_group=None, ps_mesh=None,
                 blocks: dict[str, torch.Tensor] | None = None) -> TableStore | None:
    """Take each planned table that ``models`` hold (by module path: a rank's pipeline stages, or the whole model)
    out of them: its weight moves into the table store the registry says holds it (launcher/tables/registry.py: a
    whole copy in a ReplicatedTables store; this rank's block of rows in a ShardedTables store over ``ps_group``
    when the plan shards it), and a TableLookup takes the module's place. ``blocks``: the sharded tables' blocks take_blocks already took. The
    models are changed in place; None when they hold none of the tables. The host tables' pages become huge ones on
    a background thread (launcher/tables/hugepages.py: ``store.huge_pages``)."""
    found = [(m, p, mod) for m in models for p in plans if (mod := held_module(m, p.name)) is not None]
    if not found:
        return None
    for _, p, module in found:
        why = movable(module)
        if why:
            raise TypeError(f"{p.name} cannot train outside the parallel parts: {why}. Set "
                            f"tables.{p.name}.optimizer=dense (it then trains with the rest of the model).")
    inputs = StoreInputs({p.name: mod.weight for _, p, mod in found}, compute, dtype, dp_group, ps_group, ps_mesh,
                         {p.name: mod.padding_idx for _, p, mod in found}, blocks)
    kinds: dict[str, list[TablePlan]] = {}  # in the registry's order on every rank: their exchanges are collectives
    for _, p, _ in found:
        kinds.setdefault(store_kind(p).name, []).append(p)
    stores: list[TableStore] = [STORES[k].build(tuple(kinds[k]), inputs) for k in STORES if k in kinds]
    store = stores[0] if len(stores) == 1 else Stores(stores)
    store.huge_pages = hugepages.back(store.held())  # in the background: training starts now
    for model, p, module in found:
        set_module(model, p.name, lookup_for(store, p.name, module, hashing_of(p, module)))
    for model in models:  # a TorchRec EmbeddingBagCollection of these tables: one call for all of them
        batch_collections(model)
    return store


# -- a TorchRec EmbeddingBagCollection's tables in one call ------------------------------------------------------------
# TorchRec's forward splits the KeyedJaggedTensor by feature (``to_dict``), calls each table's bag module and
# concatenates the pooled results into a KeyedTensor: with the tables in a store, one lookup, one autograd node and
# one copy per feature, then a copy of them all (26 tables: ~3 ms of a step that FBGEMM's table-batched forward does
# in one kernel). ``batch_collections`` gives each such collection a forward that makes the same KeyedTensor, rows
# and gradients in one call into the store (``ReplicatedTables.pooled``: every table's bags summed into one (batch,
# sum of dims) tensor by one kernel over the rank's threads, one autograd node). A call that path does not take
# (weighted features, a variable batch per key, a recording pass of placement.prefetch, prefetch itself, tables or
# compute not on the host's CPU) runs TorchRec's own forward, unchanged.

MODULES = "torchrec.modules.embedding_modules"
JAGGED = "torchrec.sparse.jagged_tensor"


def batch_collections(model: nn.Module) -> list[str]:
    """Give each unweighted EmbeddingBagCollection of ``model`` (TorchRec's own class: a subclass may change its
    forward) whose bags are all sum-pooled lookups into one store that has ``pooled`` the batched forward; the paths
    of those it did."""
    torchrec = sys.modules.get(MODULES)
    if torchrec is None:  # the model was built without TorchRec: it holds no collection
        return []
    done = []
    for path, module in model.named_modules():
        if type(module) is not torchrec.EmbeddingBagCollection or module._is_weighted:
            continue
        bags = list(module.embedding_bags.values())
        stores = {id(b._tables[0]) for b in bags if isinstance(b, BagLookup)}
        if len(stores) != 1 or not all(isinstance(b, BagLookup) and b.mode == "sum" and b.hashing is None
                                       and b.padding_idx is None for b in bags):
            continue
        if not hasattr(bags[0]._tables[0], "pooled") or "forward" in vars(module):
            continue
        module.forward = types.MethodType(_forward, module)  # a method of the module: a deepcopy rebinds it
        done.append(path)
    return done


def _forward(ebc: nn.Module, kjt: Any) -> Any:
    """``ebc``'s forward through its store's ``pooled``; TorchRec's own where that does not apply."""
    jagged = sys.modules[JAGGED]
    if (RECORDING.get() is not None or not isinstance(kjt, jagged.KeyedJaggedTensor)
            or kjt.variable_stride_per_key() or kjt.weights_or_none() is not None
            or kjt.inverse_indices_or_none() is not None):
        return type(ebc).forward(ebc, kjt)
    index = {k: i for i, k in enumerate(kjt.keys())}
    bags = list(ebc.embedding_bags.values())
    features = [(bag.name, f) for bag, names in zip(bags, ebc._feature_names) for f in names]
    if any(f not in index for _, f in features):
        return type(ebc).forward(ebc, kjt)  # TorchRec's own message for the missing feature
    values = bags[0]._tables[0].pooled([name for name, _ in features], [index[f] for _, f in features],
                                       kjt.values(), kjt.offsets(), kjt.stride())
    if values is None:
        return type(ebc).forward(ebc, kjt)
    return jagged.KeyedTensor(keys=ebc._embedding_names, values=values, length_per_key=ebc._lengths_per_embedding)
