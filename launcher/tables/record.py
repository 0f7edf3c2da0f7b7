"""How a table store learns the next micro-batches' ids (``placement.prefetch``): the trainer's side.

A model computes the ids it looks up inside its own forward (Wide&Deep adds each field's row offset; a hashed
table hashes raw ids; a user's model may do anything), so the store is told a micro-batch's ids by the model itself:
``record_lookups`` runs the forward on the drawn-ahead micro-batch under ``torch.no_grad`` with every TableLookup
answering zeros of the right shape and noting (table, ids), and stops it with an exception right after the last
lookup (as many as the first, complete, recording pass saw), so for a model that looks its tables up first (a CTR
model, a language model's embeddings) the pass costs the few operations before its lookups. The pass restores
torch's random number generators (a dropout before a lookup draws nothing the real forward would not) and stops
before a module that would move BatchNorm running statistics; lookups after that stop are made as without prefetch.
A recording is never trusted blindly: the store serves prefetched rows only for the ids it recorded
(launcher/tables/prefetch.py ``take``).

``Lookahead`` keeps the drawn-ahead micro-batches (each once moved to the device) for the trainer.
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.module import register_module_forward_pre_hook

RECORDING: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("table_recording", default=None)
"""Set while a recording pass runs: TableLookup answers through it instead of its store."""


class Recorded(BaseException):
    """Ends a recording pass after its last lookup (a BaseException: a model's ``except Exception`` lets it pass)."""


class Recorder:
    def __init__(self, limit: int | None, device: torch.device, dtype: torch.dtype) -> None:
        self.limit, self.device, self.dtype = limit, device, dtype
        self.lookups: list[tuple[str, torch.Tensor]] = []
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def lookup(self, name: str, ids: torch.Tensor, dim: int) -> torch.Tensor:
        """Note (name, a copy of ids) and answer zeros shaped ids.shape + (dim,). One ids tensor looked up in two
        tables is one copy, so the store deduplicates it once."""
        held = self._copies.get(id(ids))
        if held is None or held[0] is not ids:
            held = (ids, ids.detach().clone())
            self._copies[id(ids)] = held
        self.lookups.append((name, held[1]))
        if self.limit is not None and len(self.lookups) >= self.limit:
            raise Recorded
        return torch.zeros(*ids.shape, dim, device=self.device, dtype=self.dtype)


def _stop_at_running_stats(module: torch.nn.Module, args: Any) -> None:
    if isinstance(module, _BatchNorm) and module.training and module.track_running_stats:
        raise Recorded  # its running statistics would move: the lookups after it are made as without prefetch


def record_lookups(run: Callable[[], Any], limit: int | None, device: torch.device,
                   dtype: torch.dtype) -> tuple[list[tuple[str, torch.Tensor]], bool]:
    """(the lookups ``run()`` (a forward) makes, in order, with a copy of their ids; whether it ran to its end).
    ``limit``: stop after that many lookups (None: run the whole forward)."""
    recorder = Recorder(limit, device, dtype)
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    token = RECORDING.set(recorder)
    guard = register_module_forward_pre_hook(_stop_at_running_stats)
    complete = False
    try:
        with torch.no_grad():
            run()
        complete = True
    except Recorded:
        pass
    finally:
        guard.remove()
        RECORDING.reset(token)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)
    return recorder.lookups, complete


class Lookahead:
    """Micro-batches drawn ``depth`` ahead of the one training, each one's lookups recorded and queued in ``store``
    (its ``prefetch``), so its rows are gathered while the earlier ones step."""

    def __init__(self, store: Any, depth: int, device: torch.device, dtype: torch.dtype, accum: int = 1) -> None:
        self.store, self.depth, self.device, self.dtype, self.accum = store, depth, device, dtype, accum
        self.batches: deque[Any] = deque()
        self.limit: int | None = None
        """Lookups per micro-batch, from the first recording pass that ran to the end."""
        self.on = True
        self.drawn = self.used = 0
        """Micro-batches drawn and handed out since the start (or a clear: at a step boundary); every ``accum``-th
        is the last of its step, after which the tables are updated."""

    def take(self, draw: Callable[[], Any], forward: Callable[[Any], Any]) -> tuple[Any, int]:
        """(the micro-batch to train on now, how many were drawn for it: 0 .. depth + 1). ``draw()`` gives the next
        micro-batch (moved to the device); ``forward(batch)`` runs the model on it."""
        drawn = 0
        while self.on and len(self.batches) <= self.depth:
            batch = draw()
            drawn += 1
            self.batches.append(batch)
            # its rows are gathered now unless a step's table update comes before it trains (that gathers them)
            updates_first = any((k + 1) % self.accum == 0 for k in range(self.used, self.drawn))
            self.drawn += 1
            self._record(lambda b=batch: forward(b), not updates_first)
        self.used += 1
        if not self.batches:
            return draw(), 1
        return self.batches.popleft(), drawn

    def _record(self, run: Callable[[], Any], gather: bool) -> None:
        try:
            lookups, complete = record_lookups(run, self.limit, self.device, self.dtype)
        except Exception as e:  # noqa: BLE001 (the run goes on without prefetch, and says so)
            from launcher.tables.prefetch import warn_once

            warn_once(f"placement.prefetch: the recording pass of the model's forward failed ({type(e).__name__}: "
                      f"{e}); the tables are looked up without prefetch from here on.")
            self.stop()
            return
        if complete and self.limit is None:
            self.limit = len(lookups)
            if not lookups:  # its forward looks no table up: nothing to prefetch
                self.stop()
                return
        self.store.prefetch(lookups, gather)

    def stop(self) -> None:
        """No more drawing ahead; the micro-batches already drawn are trained as usual, their lookups not prefetched."""
        self.on = False
        self.store.drop_prefetch(stop=True)

    def clear(self) -> None:
        """Forget the drawn-ahead micro-batches (the data source restarts: a checkpoint was loaded)."""
        self.batches.clear()
        self.drawn = self.used = 0
        self.store.drop_prefetch()
