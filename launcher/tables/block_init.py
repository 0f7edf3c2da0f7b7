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

import launcher.tables.hugepages as hugepages

CHUNK = 1 << 16
"""Rows initialised at a time: the unit of the chunk-seeded draws (fixed, so the values do not depend on blocks)."""
RANDOM = {"normal_", "uniform_", "kaiming_uniform_"}
"""Calls that draw: replayed with the chunk's generator."""
REPLAYED = RANDOM | {"zero_", "zeros_", "ones_", "fill_", "constant_", "mul_", "add_", "clamp_", "div_", "sub_",
                     "__setitem__"}
SAFE_INITS = {"normal_", "uniform_", "zeros_", "ones_", "constant_", "xavier_uniform_", "xavier_normal_",
              "kaiming_uniform_", "kaiming_normal_"}
"""torch.nn.init functions that reach the table only through the calls above (xavier and kaiming_normal_ compute
their bound from the whole table's shape, then call uniform_ / normal_). The others (orthogonal_, which does nothing
to a meta tensor, trunc_normal_, sparse_, eye_, dirac_) are refused on a split table."""
TABLES = (nn.Embedding, nn.EmbeddingBag)

Rows = tuple[int, int, bool]
"""The rows of the whole table a view covers: [start, stop), and whether it is one row indexed away (w[i])."""


class BlockInitError(RuntimeError):
    pass


class DeferredTables(TorchFunctionMode):
    """Inside it, the weight an nn.Embedding / nn.EmbeddingBag of a shape in ``shapes`` ((rows, dim) of the split
    tables) makes is a meta tensor, and the calls that initialise it are recorded (``calls``: by the id of the
    tensor first initialised, the module's weight; through ``.data``, ``detach()``, same-shape views and row slices
    too)."""

    def __init__(self, shapes: set[tuple[int, int]]) -> None:
        super().__init__()
        self.shapes = shapes
        self.calls: dict[int, list[tuple[Any, tuple, dict, Rows]]] = {}
        self._views: dict[int, tuple[int, Rows | None]] = {}
        """id -> (the root's id, the rows it covers; None: a view whose rows cannot be followed)."""
        self._kept: list[torch.Tensor] = []  # every tensor in _views stays alive: its id stays its own
        self._building = 0

    def __enter__(self):
        self._saved = {n: f for n, f in vars(nn.init).items() if n.endswith("_") and not n.startswith("_")
                       and n not in SAFE_INITS and callable(f)}
        for n, f in self._saved.items():
            setattr(nn.init, n, self._refusing(n, f))
        self._inits = {cls: cls.__init__ for cls in TABLES}
        for cls, init in self._inits.items():
            setattr(cls, "__init__", self._table_init(init))
        return super().__enter__()

    def __exit__(self, *exc):
        for n, f in self._saved.items():
            setattr(nn.init, n, f)
        for cls, init in self._inits.items():
            setattr(cls, "__init__", init)
        return super().__exit__(*exc)

    def _table_init(self, init):
        def call(module, *args, **kwargs):
            self._building += 1
            try:
                init(module, *args, **kwargs)
            finally:
                self._building -= 1
        return call

    def _refusing(self, name: str, func):
        def call(tensor, *args, **kwargs):
            if self._view(tensor) is not None:
                raise BlockInitError(_refusal(name, tensor))
            return func(tensor, *args, **kwargs)
        return call

    def _view(self, t: Any) -> tuple[int, Rows | None] | None:
        """(root id, rows) of a tensor that is (a view of) a deferred table; None for any other."""
        if not isinstance(t, torch.Tensor) or not t.is_meta:
            return None
        if id(t) not in self._views and _shape(t.shape) in self.shapes:
            self._views[id(t)] = (id(t), (0, t.shape[0], False))  # a table's weight, first seen
            self._kept.append(t)
        return self._views.get(id(t))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "empty" and self._building and args and _shape(args[0]) in self.shapes \
                and kwargs.get("device") in (None, "cpu"):
            return func(*args, **{**kwargs, "device": "meta"})
        target = kwargs.get("tensor", args[0] if args else None)
        view = self._view(target)
        if view is None:
            return func(*args, **kwargs)
        mutates = name == "__setitem__" or (name.endswith("_") and not name.startswith("__"))
        if mutates:
            self._record(func, name, args, kwargs, target, view)
            return target if name != "__setitem__" else None
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_meta:  # .data, detach(), view(), w[i], w[a:b], ...
            self._views[id(out)] = (view[0], _rows_of(name, args, view[1], out, target))
            self._kept.append(out)
        return out

    def _record(self, func, name: str, args: tuple, kwargs: dict, target: torch.Tensor, view) -> None:
        root, rows = view
        whole = rows is not None and rows[:2] == (0, self._root_rows(root)) and not rows[2]
        fan_in = name != "kaiming_uniform_" or (whole and kwargs.get("mode", "fan_in") == "fan_in")
        settable = name != "__setitem__" or (isinstance(args[2], (int, float)) and _rows_of(
            "__getitem__", args[:2], rows, None, target) is not None)
        if name not in REPLAYED or rows is None or not fan_in or not settable:
            raise BlockInitError(_refusal(name, target))
        if name == "__setitem__":
            rows = _rows_of("__getitem__", args[:2], rows, None, target)
        self.calls.setdefault(root, []).append((func, args, kwargs, rows))

    def _root_rows(self, root: int) -> int:
        return next(t.shape[0] for t in self._kept if id(t) == root)


def _rows_of(name: str, args: tuple, rows: Rows | None, out: torch.Tensor | None, src: torch.Tensor) -> Rows | None:
    """The rows of the whole table that a view of ``src`` (covering ``rows``) covers; None when it cannot say."""
    if rows is None or rows[2]:
        return None
    start, stop, _ = rows
    if name != "__getitem__":
        return rows if out is None or out.shape == src.shape else None
    index = args[1]
    if isinstance(index, int):
        i = index + (stop - start) if index < 0 else index
        return (start + i, start + i + 1, True) if 0 <= i < stop - start else None
    if isinstance(index, slice) and index.step in (None, 1):
        a, b, _ = index.indices(stop - start)
        return start + a, start + max(a, b), False
    return None


def _refusal(name: str, table: torch.Tensor) -> str:
    return (f"the model's initialisation calls {name} on a split table ({tuple(table.shape)}), which cannot be "
            f"replayed one block of rows at a time (placement.ps_init=blocks). Initialise the table with "
            f"nn.init.normal_ / uniform_ / zeros_ / constant_ (or xavier, kaiming with mode=fan_in), or set "
            f"placement.ps_init=whole: the table is then built whole, one rank of a host at a time.")


def _shape(size: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(n) for n in size)
    except (TypeError, ValueError):
        return None


def _seed(seed: int, name: str, chunk: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _replay(calls: list, chunk: torch.Tensor, lo: int, gen: torch.Generator) -> None:
    """Each recorded call on the rows of ``chunk`` (rows [lo, lo + len(chunk)) of the table) that it covers."""
    for func, args, kwargs, (a, b, one) in calls:
        a, b = max(a, lo), min(b, lo + len(chunk))
        if a >= b:
            continue
        rows = chunk[a - lo] if one else chunk[a - lo:b - lo]
        name = func.__name__
        if name == "__setitem__":
            rows.fill_(args[2])
            continue
        extra = {"generator": gen} if name in RANDOM else {}
        if "tensor" in kwargs:
            func(**{**kwargs, "tensor": rows, **extra})
        else:
            func(rows, *args[1:], **{**kwargs, **extra})


def init_block(calls: list, rows: int, dim: int, start: int, stop: int, seed: int, name: str) -> torch.Tensor:
    """Rows [start, stop) of a table of ``rows`` × ``dim`` as the recorded ``calls`` initialise them, chunk by
    chunk."""
    block = hugepages.advised(torch.empty(stop - start, dim))
    with torch.no_grad():
        for c in range(start // CHUNK, -(-stop // CHUNK)):
            lo, hi = c * CHUNK, min((c + 1) * CHUNK, rows)
            chunk = torch.empty(hi - lo, dim)
            _replay(calls, chunk, lo, torch.Generator().manual_seed(_seed(seed, name, c)))
            a, b = max(lo, start), min(hi, stop)
            block[a - start:b - start] = chunk[a - lo:b - lo]
    return block


def init_blocks(model: nn.Module, deferred: DeferredTables, modules: dict[str, nn.Module],
                bounds: dict[str, tuple[int, int]], seed: int) -> dict[str, torch.Tensor]:
    """Each deferred table's block (``bounds``: [start, stop) of its rows this rank owns) from the calls recorded
    on its weight (nn.Embedding's zeroing of its padding_idx row among them)."""
    blocks = {}
    for name, module in modules.items():
        weight = module.weight
        if not weight.is_meta:
            continue  # built whole after all (the model passed its own weight): take_blocks splits it
        rows, dim = weight.shape
        start, stop = bounds[name]
        blocks[name] = init_block(deferred.calls.get(id(weight), []), rows, dim, start, stop, seed, name)
    tables = {id(m.weight) for m in modules.values()}
    fix = "Set placement.ps_init=whole (the tables are then built as written, whole, one rank of a host at a time)."
    lost = set(deferred.calls) - tables
    if lost:
        raise BlockInitError(f"the model initialised a split table through a tensor that is not the module's weight "
                             f"(a copy, or a table built outside nn.Embedding / nn.EmbeddingBag). {fix}")
    left = [n for n, p in model.named_parameters() if p.is_meta and id(p) not in tables]
    if left:
        raise BlockInitError(f"{', '.join(left)}: built on the meta device with a split table's shape but not a "
                             f"table the plan splits. {fix}")
    return blocks
