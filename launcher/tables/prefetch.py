"""Host-table lookups overlapped with the dense step (``placement.prefetch``): the replicated store's side.

The trainer draws the next ``depth`` micro-batches ahead and records the lookups each one's forward will make
(launcher/tables/record.py). One background thread, first in first out, does the rest:

- ``queue``: deduplicates a recorded micro-batch's ids (the store's coalesce then needs no sort) and, when no table
  update comes before it is used (a later micro-batch of the same step), gathers its rows at once;
- ``update``: a step's table update, once the store computed it (its arithmetic in one piece on the training
  thread, as without prefetch: only its writes move). The thread writes the rows the queued micro-batches look up,
  then gathers those micro-batches' rows (after the write: **the update is ordered before the prefetch**, so no row is
  served stale), then writes the other rows, while the next micro-batch's forward and backward run;
- ``take``: inside the model's forward, serves the gathered rows if the ids are the recorded ones (compared element
  by element; other ids are looked up as without prefetch).

So the tables, the rows served and the losses are those of the serial path bit for bit (tests/tables/
test_prefetch.py, tests/integration/test_prefetch_runs.py). Anything else that reads or writes the tables waits for
the thread first (``settle``): a lookup that was not prefetched (evaluation), state_dict, digests, a learning-rate
change, loading a checkpoint (which also drops the queue). On CUDA the unique rows are gathered into pinned buffers
and copied on a side stream (``non_blocking``), expanded on the device when served, and the recorded ids are compared
there (checked once per micro-batch); that path has not run on a GPU (written and reviewed only).
"""

from __future__ import annotations

import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from launcher.tables.row_update import write_rows
from launcher.tables.transfer import PinnedRing, gather_to_device, host_to_device


@dataclass
class Gather:
    """One ids tensor of a recorded micro-batch and the host tables looked up with it."""

    names: list[str]
    ids: torch.Tensor
    """The ids as recorded (a copy, where the model had them: on the compute device)."""
    recorded: Any = None
    """CUDA: the event after which ``ids`` may be read on the side stream."""
    flat: torch.Tensor | None = None
    """The ids, flat, int64, on the host."""
    unique: torch.Tensor | None = None
    """Sorted unique ids (on the host)."""
    inverse: torch.Tensor | None = None
    """Each id's position in ``unique`` (host; CUDA: also copied to the device, ``inverse_device``)."""
    inverse_device: torch.Tensor | None = None
    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per table, when gathered: CPU: the rows of ``flat``; CUDA: the rows of ``unique`` on the device."""
    ready: Any = None
    """CUDA: the event after which ``rows`` are on the device."""
    served: set[str] = field(default_factory=set)


@dataclass
class MicroBatch:
    gathers: list[Gather]
    done: Future | None = None
    """The thread's task that gathers its rows last (its queueing, or a table update that came before its use)."""
    failed: BaseException | None = None
    """Why its ids could not be prepared (an id out of range: the lookup then fails as without prefetch)."""


class Ahead:
    """The prefetch queue of one replicated store: ``tables`` name -> its weight (host tables only)."""

    def __init__(self, tables: dict[str, torch.Tensor], compute: torch.device, dtype: torch.dtype) -> None:
        self.tables, self.compute, self.dtype = tables, compute, dtype
        self.cuda = compute.type == "cuda"
        self._queue: deque[MicroBatch] = deque()
        self._pending: list[Future] = []
        # the thread's own torch ops run with the training thread's intra-op thread count (same arithmetic)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="table-prefetch",
                                          initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))
        self._side = torch.cuda.Stream(compute) if self.cuda else None
        self._ring = PinnedRing() if self.cuda else None  # the thread's own pinned buffers
        self._mismatch: list[torch.Tensor] = []
        self.stats = {"served": 0, "missed": 0, "urgent_rows": 0, "deferred_rows": 0}

    # -- on the training thread ---------------------------------------------------------------------------------------
    def queue(self, recorded: list[tuple[str, torch.Tensor]], gather: bool = True) -> None:
        """One micro-batch's recorded lookups, in the order its forward makes them (other stores' tables left out);
        ``gather``: gather its rows now (no table update comes before its use)."""
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
        mb.done = self._submit(self._prepare, mb, gather)
        self._queue.append(mb)

    def take(self, name: str, ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None] | None:
        """(the rows of ``ids`` on the compute device, in the run's dtype; (unique, inverse) for the store's
        coalesce, on the CPU only) when the micro-batch now running recorded this lookup; else None."""
        mb = self._queue[0] if self._queue else None
        if mb is not None:
            mb.done.result()  # a failed table update raises here
        g = None if mb is None or mb.failed is not None else next(
            (g for g in mb.gathers if name in g.names and name in g.rows and name not in g.served
             and g.ids.shape == ids.shape and self._same(g.ids, ids)), None)
        if g is None:
            self.stats["missed"] += 1
            return None
        g.served.add(name)
        self.stats["served"] += 1
        rows = g.rows[name]
        if self.cuda:
            stream = torch.cuda.current_stream(self.compute)
            stream.wait_event(g.ready)
            rows.record_stream(stream)
            g.inverse_device.record_stream(stream)
            rows = rows.index_select(0, g.inverse_device)
        if rows.dtype != self.dtype:
            rows = rows.to(self.dtype)
        return rows, None if self.cuda else (g.unique, g.inverse)

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

    def update(self, work: list[tuple[str, torch.Tensor, list | None]]) -> None:
        """A step's table update to write, each (table, its sorted unique rows, the optimizer's ``updates`` of them;
        None: written already), as the module's docstring says. The queued micro-batches' rows are gathered after it;
        call it after every step, also one that updated no row. The caller ``settle``d the thread before it computed
        the update (which read the rows the last one wrote)."""
        entries = list(self._queue)
        later: list[tuple[torch.Tensor, list, torch.Tensor]] = []
        head = self._submit(self._update, work, entries, later)
        for mb in entries:
            mb.done = head
        self._submit(self._write_later, later)

    def settle(self) -> None:
        """Wait until the thread has nothing left (a failed table update raises here)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def drop(self) -> None:
        """Forget every queued micro-batch (the tables were written from outside: a checkpoint was loaded)."""
        self.settle()
        self._queue.clear()
        self._mismatch.clear()

    def close(self) -> None:
        self.drop()
        self._thread.shutdown(wait=True)

    def _submit(self, fn, *args) -> Future:
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        future = self._thread.submit(fn, *args)
        self._pending.append(future)
        return future

    # -- on the thread ------------------------------------------------------------------------------------------------
    def _prepare(self, mb: MicroBatch, gather: bool) -> None:
        try:
            for g in mb.gathers:
                self._dedup(g)
                if gather:
                    self._gather(g)
        except Exception as e:  # noqa: BLE001 (its lookups are made as without prefetch, which says what is wrong)
            mb.failed = e

    def _dedup(self, g: Gather) -> None:
        if self.cuda:
            with torch.cuda.stream(self._side):
                self._side.wait_event(g.recorded)
                g.flat = g.ids.reshape(-1).to("cpu", torch.int64)
        else:
            g.flat = g.ids.reshape(-1).to(torch.int64)
        g.unique, g.inverse = torch.unique(g.flat, sorted=True, return_inverse=True)
        if self.cuda:
            with torch.cuda.stream(self._side):
                g.inverse_device = self._to_device(g.inverse)

    def _gather(self, g: Gather) -> None:
        """Each table's rows of the micro-batch as they are now (CPU: one gather, as the serial lookup's)."""
        if not self.cuda:
            g.rows = {name: torch.index_select(self.tables[name], 0, g.flat) for name in g.names}
            return
        with torch.cuda.stream(self._side):
            g.rows = {name: gather_to_device(self.tables[name], g.unique, self.compute, staging=self._ring)
                      for name in g.names}
            g.ready = torch.cuda.Event()
            g.ready.record(self._side)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return host_to_device(t, self.compute, staging=self._ring)

    def _update(self, work, entries: list[MicroBatch], later: list) -> None:
        """The rows the queued micro-batches need written, then those micro-batches gathered (``later``: the rest)."""
        hits: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, rows, updates in work:
            if updates is None:  # torch's SparseAdam wrote its step itself
                continue
            if id(rows) not in hits:  # tables looked up together share their rows: one search
                hits[id(rows)] = self._needed(name, rows, entries)
            urgent, rest = hits[id(rows)]
            write_rows(rows, updates, urgent)
            later.append((rows, updates, rest))
            self.stats["urgent_rows"] += len(urgent)
            self.stats["deferred_rows"] += len(rest)
        for mb in entries:
            if mb.failed is None:
                for g in mb.gathers:
                    self._gather(g)

    def _needed(self, name: str, rows: torch.Tensor, entries: list[MicroBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions in ``rows`` (sorted unique) that a queued micro-batch looks up in table ``name``, and the others."""
        hit = torch.zeros(len(rows), dtype=torch.bool)
        for mb in entries:
            for g in mb.gathers:
                if name in g.names and g.unique is not None and len(g.unique):
                    pos = torch.searchsorted(g.unique, rows).clamp_(max=len(g.unique) - 1)
                    hit |= g.unique.index_select(0, pos) == rows
        return hit.nonzero().squeeze(1), (~hit).nonzero().squeeze(1)

    def _write_later(self, later: list) -> None:
        for rows, updates, rest in later:
            if len(rest):
                write_rows(rows, updates, rest)


def warn_once(message: str, _said: set[str] = set()) -> None:  # noqa: B006 (one set per process on purpose)
    if message not in _said:
        _said.add(message)
        warnings.warn(message, stacklevel=2)
