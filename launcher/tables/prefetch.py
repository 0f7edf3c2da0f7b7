"""Host-table lookups overlapped with the dense step (``placement.prefetch``): the replicated store's side.

The trainer draws the next ``depth`` micro-batches ahead and records the lookups each one's forward will make
(launcher/tables/record.py). ``Ahead.queue`` hands each recorded micro-batch to one background thread, which
deduplicates its ids and gathers the unique rows of each host table (on CUDA into pinned buffers, copied to the
device on a side stream, non-blocking) while the current micro-batch runs its forward, backward and dense step. When
the model then looks a table up, ``take`` serves the prefetched rows if the ids are the recorded ones (compared
element by element; other ids are looked up as without prefetch) and hands the store the deduplication, so the
store's per-step coalesce needs no sort.

Rows updated at step t are never served stale at t + 1. The choice is **re-gather the touched rows**: the update of
step t computes every touched row as without prefetch, then writes first the rows a queued micro-batch will look up
(``needed``) and re-gathers exactly those into the queued micro-batches (``patch``); the other rows are written by the
background thread (``defer``) while step t + 1 runs, and the thread gathers the next micro-batch only after that
write (one thread, first in first out). The update's arithmetic is done in one piece before either write, so the
tables, served rows and losses are those of the serial path bit for bit (tested, tests/tables/test_prefetch.py).
Anything else that reads or writes the tables (``settle``) waits for the thread first: a step's exchange, a lookup
that was not prefetched (evaluation), state_dict, digests, loading a checkpoint (which also drops the queue).
"""

from __future__ import annotations

import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from launcher.tables.sparse_optim import write_rows
from launcher.tables.transfer import PinnedRing, gather_to_device


@dataclass
class Gather:
    """One ids tensor of a recorded micro-batch and the host tables looked up with it."""

    names: list[str]
    ids: torch.Tensor
    """The ids as recorded (a copy, where the model had them: on the compute device)."""
    recorded: Any = None
    """CUDA: the event after which ``ids`` may be read on the side stream."""
    unique: torch.Tensor | None = None
    """Sorted unique ids (int64, on the host)."""
    inverse: torch.Tensor | None = None
    """Each id's position in ``unique`` (on the compute device)."""
    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per table: its rows of ``unique`` (fp32, on the compute device)."""
    ready: Any = None
    """CUDA: the event after which ``rows`` and ``inverse`` are on the device."""
    served: set[str] = field(default_factory=set)


@dataclass
class MicroBatch:
    gathers: list[Gather]
    done: Future | None = None


class Ahead:
    """The prefetch queue of one replicated store: ``tables`` name -> its weight (host tables only)."""

    def __init__(self, tables: dict[str, torch.Tensor], compute: torch.device, dtype: torch.dtype) -> None:
        self.tables, self.compute, self.dtype = tables, compute, dtype
        self.cuda = compute.type == "cuda"
        self._queue: deque[MicroBatch] = deque()
        self._pending: list[Future] = []
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="table-prefetch")
        self._side = torch.cuda.Stream(compute) if self.cuda else None
        self._ring = PinnedRing() if self.cuda else None  # the thread's own pinned buffers
        self._mismatch: list[torch.Tensor] = []
        self.stats = {"served": 0, "missed": 0, "deferred_rows": 0, "urgent_rows": 0}

    # -- queueing (the trainer, after recording a micro-batch) --------------------------------------------------------
    def queue(self, recorded: list[tuple[str, torch.Tensor]]) -> None:
        """One micro-batch's recorded lookups, in the order its forward makes them (other stores' tables left out)."""
        gathers: list[Gather] = []
        for name, ids in recorded:
            if name not in self.tables:
                continue
            same = next((g for g in gathers if g.ids is ids and name not in g.names), None)
            if same is None:
                gathers.append(Gather([name], ids))
            else:
                same.names.append(name)
        if self.cuda:
            for g in gathers:
                g.recorded = torch.cuda.Event()
                g.recorded.record(torch.cuda.current_stream(self.compute))
        mb = MicroBatch(gathers)
        mb.done = self._submit(self._prepare, mb)
        self._queue.append(mb)

    def _submit(self, fn, *args) -> Future:
        future = self._thread.submit(fn, *args)
        self._pending.append(future)
        return future

    def _prepare(self, mb: MicroBatch) -> None:
        """On the thread: deduplicate and gather (CUDA: on the side stream, into pinned buffers)."""
        for g in mb.gathers:
            if self.cuda:
                with torch.cuda.stream(self._side):
                    self._side.wait_event(g.recorded)
                    self._gather(g, g.ids.reshape(-1).to("cpu", torch.int64))
                    g.ready = torch.cuda.Event()
                    g.ready.record(self._side)
            else:
                self._gather(g, g.ids.reshape(-1).to(torch.int64))

    def _gather(self, g: Gather, ids: torch.Tensor) -> None:
        g.unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        for name in g.names:
            g.rows[name] = gather_to_device(self.tables[name], g.unique, self.compute, staging=self._ring)
        if self.cuda:
            staged, slot = self._ring.stage(tuple(inverse.shape), inverse.dtype)
            staged.copy_(inverse)
            g.inverse = staged.to(self.compute, non_blocking=True)
            self._ring.sent(slot, self.compute)
        else:
            g.inverse = inverse

    # -- serving (inside the model's forward) -------------------------------------------------------------------------
    def take(self, name: str, ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None] | None:
        """(the rows of ``ids`` on the compute device, in the run's dtype; (unique, inverse) for the store's
        coalesce, on the CPU only) when the micro-batch now running recorded this lookup; else None."""
        mb = self._queue[0] if self._queue else None
        if mb is None or not self._ready(mb):
            self.stats["missed"] += 1
            return None
        g = next((g for g in mb.gathers if name in g.names and name not in g.served and g.ids.shape == ids.shape
                  and self._same(g.ids, ids)), None)
        if g is None:
            self.stats["missed"] += 1
            return None
        g.served.add(name)
        self.stats["served"] += 1
        rows, inverse = g.rows[name], g.inverse
        if self.cuda:
            stream = torch.cuda.current_stream(self.compute)
            stream.wait_event(g.ready)
            rows.record_stream(stream)
            inverse.record_stream(stream)
        act = rows.index_select(0, inverse)
        if act.dtype != self.dtype:
            act = act.to(self.dtype)
        return act, None if self.cuda else (g.unique, g.inverse)

    def _ready(self, mb: MicroBatch) -> bool:
        """Wait for the micro-batch's gathers; False when they failed (the lookup then says why, as without)."""
        try:
            mb.done.result()
            return True
        except Exception:  # noqa: BLE001 (e.g. an id out of range: the serial lookup raises the usual error)
            return False

    def _same(self, recorded: torch.Tensor, ids: torch.Tensor) -> bool:
        """Whether the model looks up the recorded ids. CUDA: compared on the device and checked at ``done`` (one
        host sync per micro-batch, not one per lookup)."""
        if recorded.device != ids.device:
            return False
        if self.cuda:
            self._mismatch.append((recorded != ids).any())
            return True
        return torch.equal(recorded, ids)

    def done(self) -> None:
        """After a micro-batch's backward: it leaves the queue."""
        if self._queue:
            self._queue.popleft()
        if self._mismatch:
            bad = bool(torch.stack(self._mismatch).any())
            self._mismatch.clear()
            if bad:
                raise RuntimeError("placement.prefetch: the model looked a host table up with other ids than its "
                                   "recorded forward pass of the same micro-batch had (a forward whose ids depend on "
                                   "something besides the batch), and the prefetched rows were used. Set "
                                   "placement.prefetch=0 for this model.")

    # -- the update (the store's step) --------------------------------------------------------------------------------
    def settle(self) -> None:
        """Wait until the thread has nothing left: its gathers and deferred writes are done."""
        pending, self._pending = self._pending, []
        for future in pending:
            try:
                future.result()
            except Exception:  # noqa: BLE001 (a failed gather: take serves nothing from it)
                pass

    def needed(self, name: str, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions in ``rows`` (sorted unique rows a step updates) a queued micro-batch looks up, and the others."""
        queued = [g.unique for mb in self._queue for g in mb.gathers if name in g.names and g.unique is not None]
        hit = torch.isin(rows, torch.cat(queued)) if queued else torch.zeros_like(rows, dtype=torch.bool)
        return hit.nonzero().squeeze(1), (~hit).nonzero().squeeze(1)

    def write(self, name: str, rows: torch.Tensor, updates: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write a table's update (its arithmetic done): now the rows queued micro-batches need, and re-gather them
        there; the rest on the thread, before anything it does next. The store settled the thread at the start of
        its step (the queued gathers are done, so ``needed`` knows their ids)."""
        urgent, rest = self.needed(name, rows)
        write_rows(rows, updates, urgent)
        self.patch(name, rows.index_select(0, urgent))
        if len(rest):
            self._submit(write_rows, rows, updates, rest)
        self.stats["urgent_rows"] += len(urgent)
        self.stats["deferred_rows"] += len(rest)

    def patch(self, name: str, touched: torch.Tensor) -> None:
        """Re-gather ``touched`` rows (sorted, just written) wherever a queued micro-batch holds them."""
        weight = self.tables[name]
        for mb in self._queue:
            for g in mb.gathers:
                if name not in g.names or g.unique is None or not len(touched):
                    continue
                pos = torch.searchsorted(g.unique, touched).clamp_(max=len(g.unique) - 1)
                pos = pos[g.unique.index_select(0, pos) == touched]
                if not len(pos):
                    continue
                fresh = gather_to_device(weight, g.unique.index_select(0, pos), self.compute)
                if self.cuda:  # after the side stream's copy; the rows' memory kept until this stream is done
                    stream = torch.cuda.current_stream(self.compute)
                    stream.wait_event(g.ready)
                    g.rows[name].record_stream(stream)
                    pos = pos.to(self.compute)
                g.rows[name].index_copy_(0, pos, fresh)

    def drop(self) -> None:
        """Forget every queued micro-batch (the tables were written from outside: a checkpoint was loaded)."""
        self.settle()
        self._queue.clear()
        self._mismatch.clear()

    def close(self) -> None:
        self.drop()
        self._thread.shutdown(wait=True)


def warn_once(message: str, _said: set[str] = set()) -> None:  # noqa: B006 (one set per process on purpose)
    if message not in _said:
        _said.add(message)
        warnings.warn(message, stacklevel=2)
