"""The sharded table store (parameter-server mode, ``placement.ps``): each table's rows are split over the ranks of
its group (its pipeline stage's ranks; all ranks without stages), so one copy of each row and of its optimizer
state exists in the job. Rank i owns one contiguous block of rows (launcher/tables/partition.py), on the host.

Per step (launcher/tables/ps_comm.py):
- ``lookup``: the batch's ids are deduplicated and sent to their owners (all-to-all), each owner gathers the rows
  it was asked for from its block and sends them back (all-to-all); a table looked up with the same ids tensor as
  an earlier one in the same forward (Wide&Deep's two tables) reuses that route and costs one all-to-all.
- ``collect``: each lookup's gradient is summed over duplicate ids (per unique id), unscaled by the loss scale.
- ``step``: the gradients go back to the owners over the same routes (one all-to-all per route, the tables side by
  side), each owner sums what every rank sent for each of its rows in rank order, divides by the group size (the
  mean over data-parallel ranks; tensor-parallel ranks send identical gradients) and applies the table's row-sparse
  optimizer to its rows. The step skips on every rank when any owner saw a non-finite gradient, as the replicated
  store's.

Numerically it is the replicated store's update: the same optimizer on the same rows, and with one micro-batch a step
the same sums in the same rank order (bit-identical losses on 2 ranks); with gradient accumulation an owner adds
micro-batch by micro-batch, then rank by rank, so the sums may differ in their last bits. ``state_dict`` gives each
block and its states as DTensors (``Shard(0)`` over the group, on a CPU mesh), so
``torch.distributed.checkpoint`` writes one copy of each table and reshards it on load onto another number of
ranks (or into a replicated store, whose plain tensors take the whole table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

import launcher.tables.kernels as kernels
from launcher.plan.placement import TablePlan
from launcher.tables.partition import RowPartition
from launcher.tables.ps_comm import Route, bytes_sent, fetch, push, route
from launcher.tables.replicated import HOST, build_table_optimizer, row_grads, table_digest
from launcher.tables.sparse_comm import coalesce
from launcher.tables.row_update import step_all
from launcher.tables.transfer import host_to_device


@dataclass
class Block:
    plan: TablePlan
    part: RowPartition
    weight: torch.Tensor
    """This rank's rows of the table: rows [start, stop) of the whole."""
    optimizer: Any
    padding_idx: int | None = None


@dataclass
class Lookup:
    """One routed ids tensor of a forward and the tables looked up with it."""

    ids: torch.Tensor
    rows: int
    route: Route
    version: int
    """ids._version when routed: an ids tensor changed in place since is routed again."""
    names: list[str] = field(default_factory=list)
    """Tables looked up with this route: a table looked up again (the next micro-batch) is routed again."""
    acts: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    grads: list[tuple[str, torch.Tensor | None]] = field(default_factory=list)
    open: bool = True
    """False once collect took its gradients: the next forward routes its own ids."""


class ShardedTables:
    huge_pages = None
    """The background collapse of the host tables' pages (launcher/tables/hugepages.Backing), once build_tables
    started it."""

    def __init__(self, weights: dict[str, torch.Tensor], plans: tuple[TablePlan, ...], compute: torch.device,
                 dtype: torch.dtype = torch.float32, group=None, mesh=None,
                 padding: dict[str, int | None] | None = None, blocks: dict[str, torch.Tensor] | None = None) -> None:
        self.compute, self.dtype, self.group = compute, dtype, group
        self.mesh = mesh if mesh is None or mesh.device_type == "cpu" else _host_mesh(group)
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.comm_device = compute if dist.is_initialized() and dist.get_backend(group) == "nccl" else HOST
        self.tables: dict[str, Block] = {}
        for p in sorted(plans, key=lambda p: p.name):  # one order on every rank: the exchanges'
            part = RowPartition(p.rows, self.size)
            block = (blocks or {}).get(p.name)  # taken when the model was built (lookup.take_blocks)
            if block is None:
                block = part.block_of(weights[p.name], self.rank)
            self.tables[p.name] = Block(p, part, block, build_table_optimizer(p, block), (padding or {}).get(p.name))
        self._lookups: list[Lookup] = []
        self._last: Lookup | None = None
        """The latest lookup without gradients (evaluation): a second table on the same ids reuses its route."""
        self.skipped_steps = 0
        self.bytes_sent = 0
        """Bytes this rank sent to the others over the last step's lookups and gradients (ps_comm.bytes_sent)."""

    def set_lr(self, name: str, lr: float) -> None:
        self.tables[name].optimizer.lr = lr

    # -- forward ------------------------------------------------------------------------------------------------
    def _routed(self, name: str, ids: torch.Tensor, rows: int) -> Lookup:
        tracked = torch.is_grad_enabled()
        pool = self._lookups if tracked else [self._last] if self._last is not None else []
        for entry in pool:
            if entry.open and entry.ids is ids and entry.version == ids._version and entry.rows == rows \
                    and name not in entry.names:
                entry.names.append(name)
                return entry
        entry = Lookup(ids, rows, route(ids, self.tables[name].part, self.group, self.comm_device), ids._version,
                       [name])
        if tracked:
            self._lookups.append(entry)
        else:
            self._last = entry
        return entry

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        t = self.tables[name]
        entry = self._routed(name, ids, t.plan.rows)
        unique_rows = fetch(t.weight, entry.route, self.group, self.comm_device)
        rows = unique_rows.index_select(0, entry.route.inverse.to(unique_rows.device))
        act = host_to_device(rows, self.compute, self.dtype)
        if torch.is_grad_enabled():
            act.requires_grad_()
            entry.acts.append((name, act))
        return act.view(*ids.shape, t.plan.dim)

    def collect(self, grad_scale: float = 1.0) -> None:
        """Each lookup's gradient summed per unique id (None where the loss did not reach it)."""
        for entry in self._lookups:
            inverse = entry.route.inverse.to(self.compute)
            for name, act in entry.acts:
                t = self.tables[name]
                # summed per unique id (each was looked up at least once: coalesce gives all of them, in order),
                # deterministically on CUDA too (no atomics)
                grad = None if act.grad is None else coalesce(
                    inverse, row_grads(act.grad, entry.ids, t.plan.dim, t.padding_idx, grad_scale))[1]
                entry.grads.append((name, grad))
            entry.acts, entry.open = [], False

    # -- step -----------------------------------------------------------------------------------------------------
    def _reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(t, group=self.group)
        return t

    def _present(self) -> list[list[bool]]:
        """Per lookup and table: whether any rank has that gradient with any rows (one all-reduce): a rank that has
        none sends zeros, and a table no rank has is neither sent nor stepped."""
        flags = [[g is not None and sum(e.route.sent) > 0 for _, g in e.grads] for e in self._lookups]
        flat = torch.tensor([f for row in flags for f in row] or [0], dtype=torch.int64, device=self.comm_device)
        summed = self._reduce_sum(flat).tolist()
        out, k = [], 0
        for row in flags:
            out.append([s > 0 for s in summed[k:k + len(row)]])
            k += len(row)
        return out

    def _received(self) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
        """(local rows, gradients) each rank sent this owner, per table, in lookup then rank order."""
        got: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.bytes_sent = 0
        for entry, present in zip(self._lookups, self._present()):
            names = [(n, g) for (n, g), p in zip(entry.grads, present) if p]
            if not names:
                continue
            n_unique = sum(entry.route.sent)
            dims = [self.tables[n].plan.dim for n, _ in names]
            values = torch.cat([g if g is not None else torch.zeros(n_unique, d, device=self.compute)
                                for (_, g), d in zip(names, dims)], dim=1)
            received = push(values.to(self.comm_device), entry.route, self.group).to(HOST)
            self.bytes_sent += bytes_sent(entry.route, dims, self.rank)
            start = 0
            for (name, _), d in zip(names, dims):
                got.setdefault(name, []).append((entry.route.asked.to(HOST), received[:, start:start + d]))
                start += d
        return got

    def step(self) -> bool:
        got = self._received()
        self._lookups.clear()
        updates = {}
        for name, parts in got.items():
            rows, grads = coalesce(torch.cat([r for r, _ in parts]), torch.cat([g for _, g in parts]),
                                   any_order=True)
            updates[name] = (rows, grads / self.size)
        finite = kernels.all_finite([g for _, g in updates.values()])
        bad = self._reduce_sum(torch.tensor([0 if finite else 1], device=self.comm_device))
        if int(bad.item()):
            self.skipped_steps += 1
            return False
        step_all([(self.tables[name].optimizer, rows, grads.contiguous()) for name, (rows, grads) in updates.items()])
        return True

    def discard(self) -> None:
        self._lookups.clear()
        self._last = None

    # -- state ----------------------------------------------------------------------------------------------------
    def digests(self) -> dict[str, str]:
        """sha256 of this rank's block of each table (read in chunks: no copy of the block)."""
        return {name: table_digest(t.weight) for name, t in self.tables.items()}

    def held(self) -> dict[str, tuple[str, torch.Tensor, list[torch.Tensor]]]:
        return {name: (t.plan.location, t.weight, t.optimizer.state_tensors()) for name, t in self.tables.items()}

    def _global(self, t: Block, local: torch.Tensor) -> Any:
        """A block-shaped tensor as the whole table's DTensor (Shard(0) over the group): DCP saves one copy and
        reshards on load."""
        if self.mesh is None or not torch.is_tensor(local) or local.dim() == 0 or len(local) != len(t.weight):
            return local
        from torch.distributed.tensor import DTensor, Shard

        shape = torch.Size([t.plan.rows, *local.shape[1:]])
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False, shape=shape,
                                  stride=_contiguous_stride(shape))

    def state_dict(self) -> dict[str, Any]:
        """Each table's block and its optimizer's states (DTensors over the group), step counts as numbers."""
        return {name: {"weight": self._global(t, t.weight),
                       "optimizer": {k: self._global(t, v) for k, v in t.optimizer.state_dict().items()}}
                for name, t in self.tables.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, t in self.tables.items():
            t.weight.copy_(_local(state[name]["weight"]))
            t.optimizer.load_state_dict({k: _local(v) for k, v in state[name]["optimizer"].items()})


def _host_mesh(group):
    """A CPU mesh over the table group: DTensor.from_local moves a local tensor to its mesh's device, and the blocks
    live on the host (a CUDA mesh would copy every block to the GPU at each checkpoint). Never run on a GPU."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, "cpu", mesh_dim_names=("tables",))


def _local(value: Any) -> Any:
    """This rank's block of a loaded value (a DTensor's local shard); numbers as they are."""
    return value.to_local() if hasattr(value, "to_local") else value


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= n
    return tuple(reversed(stride))
