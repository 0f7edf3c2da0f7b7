"""Building a model whose sharded tables are never whole: each rank makes only its block of rows.

A table larger than a host cannot be built whole and then split. While the recipe's model is built,
``DeferredTables`` (a ``TorchFunctionMode``) makes the weights of the sharded tables' shapes on the meta device and
records the initialisation the model applies to them (``nn.Embedding``'s own ``normal_``, then the recipe's
``nn.init.normal_`` / ``uniform_`` / ``zeros_`` / ``constant_``, xavier and kaiming, which call those, and
elementwise ``mul_`` / ``add_`` / ``clamp_``). ``init_blocks`` then replays those calls on each chunk of
``CHUNK`` rows the rank owns, with random draws from a generator seeded by (the run's seed, the table, the chunk):
a row's initial value depends on neither the number of ranks nor the block, so runs on 2 and on 4 ranks start
alike, and a rank holds its block plus one chunk.

What differs from a whole build: the random values (other draws than the global generator's), the draws the dense
layers made after the tables (the tables no longer consume the global generator), and a row ``padding_idx`` names is
zeroed after the replay (nn.Embedding zeroes it at construction). An initialisation that is not a whole-tensor call
above (``copy_`` from pretrained rows, ``orthogonal_``, a data-dependent loop such as ``trunc_normal_``'s) cannot be
replayed per chunk: the build stops with what to do (``placement.ps_init=whole``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

CHUNK = 1 << 16
"""Rows initialised at a time: the unit of the chunk-seeded draws (fixed, so the values do not depend on blocks)."""
RANDOM = {"normal_", "uniform_"}
"""Calls that draw: replayed with the chunk's generator."""
REPLAYED = RANDOM | {"zero_", "zeros_", "ones_", "fill_", "constant_", "mul_", "add_", "clamp_", "div_", "sub_"}


SAFE_INITS = {"normal_", "uniform_", "zeros_", "ones_", "constant_", "xavier_uniform_", "xavier_normal_",
              "kaiming_uniform_", "kaiming_normal_"}
"""torch.nn.init functions that reach the table only through the calls above. The others (orthogonal_, which
does nothing to a meta tensor, trunc_normal_, sparse_, eye_, dirac_) are refused on a split table."""


class BlockInitError(RuntimeError):
    pass


class DeferredTables(TorchFunctionMode):
    """Inside it, ``torch.empty`` of a shape in ``shapes`` ((rows, dim) of the sharded tables) gives a meta tensor,
    and the whole-tensor calls that initialise such a tensor are recorded (``calls``: by the id of the parameter
    the model keeps)."""

    def __init__(self, shapes: set[tuple[int, int]]) -> None:
        super().__init__()
        self.shapes = shapes
        self.calls: dict[int, list[tuple[Any, tuple, dict]]] = {}
        self._kept: list[torch.Tensor] = []  # the recorded tensors stay alive: their ids stay theirs

    def __enter__(self):
        self._saved = {n: f for n, f in vars(nn.init).items() if n.endswith("_") and not n.startswith("_")
                       and n not in SAFE_INITS and callable(f)}
        for n, f in self._saved.items():
            setattr(nn.init, n, self._refusing(n, f))
        return super().__enter__()

    def __exit__(self, *exc):
        for n, f in self._saved.items():
            setattr(nn.init, n, f)
        return super().__exit__(*exc)

    def _refusing(self, name: str, func):
        def call(tensor, *args, **kwargs):
            if isinstance(tensor, torch.Tensor) and tensor.is_meta and _shape(tensor.shape) in self.shapes:
                raise BlockInitError(_refusal(name, tensor))
            return func(tensor, *args, **kwargs)
        return call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "empty" and args and _shape(args[0]) in self.shapes and kwargs.get("device") in (None, "cpu"):
            return func(*args, **{**kwargs, "device": "meta"})
        target = kwargs.get("tensor", args[0] if args else None)
        if name.endswith("_") and not name.startswith("__") and isinstance(target, torch.Tensor) and target.is_meta \
                and _shape(target.shape) in self.shapes:
            if name not in REPLAYED:
                raise BlockInitError(_refusal(name, target))
            if id(target) not in self.calls:
                self._kept.append(target)
            self.calls.setdefault(id(target), []).append((func, args, kwargs))
            return target
        return func(*args, **kwargs)


def _refusal(name: str, table: torch.Tensor) -> str:
    return (f"the model's initialisation calls {name} on a split table ({tuple(table.shape)}), which cannot be "
            f"replayed one block of rows at a time (placement.ps_init=blocks). Initialise the table with "
            f"nn.init.normal_ / uniform_ / zeros_ / constant_ (or xavier / kaiming), or set placement.ps_init=whole: "
            f"the table is then built whole, one rank of a host at a time.")


def _shape(size: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(n) for n in size)
    except (TypeError, ValueError):
        return None


def _seed(seed: int, name: str, chunk: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _replay(calls: list[tuple[Any, tuple, dict]], chunk: torch.Tensor, gen: torch.Generator) -> None:
    for func, args, kwargs in calls:
        name = func.__name__
        extra = {"generator": gen} if name in RANDOM else {}
        if "tensor" in kwargs:
            func(**{**kwargs, "tensor": chunk, **extra})
        else:
            func(chunk, *args[1:], **{**kwargs, **extra})


def init_block(calls: list, rows: int, dim: int, start: int, stop: int, seed: int, name: str) -> torch.Tensor:
    """Rows [start, stop) of a table of ``rows`` × ``dim`` as the recorded ``calls`` initialise them, chunk by
    chunk."""
    block = torch.empty(stop - start, dim)
    with torch.no_grad():
        for c in range(start // CHUNK, -(-stop // CHUNK)):
            lo, hi = c * CHUNK, min((c + 1) * CHUNK, rows)
            chunk = torch.empty(hi - lo, dim)
            _replay(calls, chunk, torch.Generator().manual_seed(_seed(seed, name, c)))
            a, b = max(lo, start), min(hi, stop)
            block[a - start:b - start] = chunk[a - lo:b - lo]
    return block


def init_blocks(model: nn.Module, deferred: DeferredTables, modules: dict[str, nn.Module],
                bounds: dict[str, tuple[int, int]], seed: int) -> dict[str, torch.Tensor]:
    """Each deferred table's block (``bounds``: [start, stop) of its rows this rank owns) from the calls recorded
    on its weight; its padding row zeroed."""
    blocks = {}
    for name, module in modules.items():
        weight = module.weight
        if not weight.is_meta:
            continue  # built whole after all (the model passed its own weight): take_blocks splits it
        rows, dim = weight.shape
        start, stop = bounds[name]
        blocks[name] = init_block(deferred.calls.get(id(weight), []), rows, dim, start, stop, seed, name)
        pad = getattr(module, "padding_idx", None)
        if pad is not None and start <= pad < stop:
            blocks[name][pad - start] = 0.0
    left = [n for n, p in model.named_parameters() if p.is_meta and n.rsplit(".", 1)[0] not in modules]
    if left:
        raise BlockInitError(f"{', '.join(left)} took a sharded table's shape and was built on the meta device")
    return blocks
