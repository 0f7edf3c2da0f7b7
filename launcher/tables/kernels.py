"""The host tables' fused kernels: launcher/tables/kernels.c, built once per compiler and source into the cache
(launcher/native.py: ``$HL_CACHE_DIR/native/``, ~1 s with gcc) and loaded with ctypes; torch ops where they cannot be.

Why C: a step of many small host tables is bound by torch's cost per call (~10 us each, ~30 calls per table), not
by memory: the coalesce of a lookup's gradients (torch: a sort, a fill, an index_add_) and a row-sparse optimizer's
update (a gather, a few element-wise ops, a scatter per state) are one pass each here, over rows prefetched ahead,
spread over the rank's intra-op threads; a step's coalesces are one call, and so are its updates with one optimizer
(``update_many``: every table's rows one range over the threads), so the cost per table is a few microseconds of
Python (bench/tbe_bench.py measures both paths against FBGEMM's TBE).

``available()`` says whether the kernels loaded, and ``why_not()`` why not (no C compiler, a failed build):
the stores then use the torch ops, with the same results (tests/tables/test_kernels.py holds the two paths to each
other, to <= 1e-6). ``HL_TABLE_KERNELS=torch`` chooses the torch ops on purpose (a benchmark, a debugging run).
Only fp32 tables on the host (or a CPU "device") with int64 rows take the kernels; anything else takes torch's ops.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import struct
import subprocess
from pathlib import Path

import torch

from launcher import native
from launcher.constants import MMAP_MAX
from launcher.tables import hugepages

SOURCE = Path(__file__).with_name("kernels.c")

_lib: ctypes.CDLL | None = None
_why = ""
_tried = False

I64, PTR = ctypes.c_int64, ctypes.c_void_p


JOB = struct.Struct("<8Q3q8f2i")
"""One table's update, packed as kernels.c's Job (128 bytes, no padding): pointers to the table, up to two states and
where their new values go (0: in place), to the unique rows and their gradients; table_rows, n, d; the optimizer's 8
constants c[8] and 2 flags (their meaning: each optimizer's row function in kernels.c). Packed with ``struct`` (~3 us
a job) rather than built as a ctypes.Structure (~9 us: a step of 26 tables paid ~0.15 ms for it)."""
JOB_N, JOB_TABLE_ROWS = 9, 8
"""Where a packed Job's n and table_rows are among its fields."""
_NO_CONSTANTS = (0.0,) * 8
FP32_MAX = 3.4028234663852886e38


UPDATES = ("sgd", "lazy_adam", "ftrl", "adagrad")
"""The update kernels: hl_<name>(count, jobs, threads)."""

SIGNATURES = {
    **{f"hl_{name}": [I64, ctypes.c_char_p, ctypes.c_int] for name in UPDATES},  # the packed JOBs
    "hl_coalesce_many": [I64, PTR, PTR, PTR, PTR, PTR, I64, PTR, PTR, PTR, PTR, ctypes.c_int],
    "hl_gather": [PTR, I64, PTR, I64, I64, PTR, ctypes.c_int],
    "hl_all_finite": [I64, PTR, PTR, ctypes.c_int],
    "hl_pool_many": [I64, PTR, PTR, PTR, PTR, PTR, PTR, PTR, I64, PTR, I64, PTR, ctypes.c_int],
}


def library(source: Path = SOURCE) -> ctypes.CDLL:
    """kernels.c at ``source`` built (launcher/native.py, cached by content) and loaded, its functions given
    SIGNATURES (bench/kernels_ab.py loads another revision's beside this one)."""
    lib = ctypes.CDLL(str(native.build(source)))
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, I64
    return lib


def _load() -> None:
    global _lib, _why, _tried
    _tried = True
    if os.environ.get(native.ENV, "auto") == "torch":
        _why = f"{native.ENV}=torch"
        return
    try:
        _lib = library()
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _why = f"the kernels did not build: {e}" if native.compiler() else str(e)


def available() -> bool:
    if not _tried:
        _load()
    return _lib is not None


def why_not() -> str:
    available()
    return _why


def kernel_name() -> str:
    """What a host table's coalesce and update run on here: 'c' or 'torch (<why>)'."""
    return "c" if available() else f"torch ({why_not()})"


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels take these: loaded, every tensor on the CPU, contiguous, fp32 or int64."""
    if not available():
        return False
    for t in tensors:
        if not (t.is_cpu and t.is_contiguous() and (t.dtype is torch.float32 or t.dtype is torch.int64)):
            return False
    return True


def _check(result: int, rows: torch.Tensor, limit: int) -> None:
    if result < 0:
        bad = int(rows[-result - 1])
        raise IndexError(f"index {bad} is out of bounds for a table of {limit} rows")


def coalescable(rows: torch.Tensor, values: torch.Tensor) -> bool:
    """``coalesce`` takes these: int64 rows, fp32 (n, d) values whose rows may lie apart (a column slice) on the CPU."""
    return (available() and rows.is_cpu and values.is_cpu and rows.dtype is torch.int64 and rows.dim() == 1
            and rows.is_contiguous() and values.dtype is torch.float32 and values.dim() == 2
            and values.stride(1) == 1 and rows.shape[0] == values.shape[0])


def coalesce(rows: torch.Tensor, values: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct rows ascending, the sum of each one's values in index order): torch.unique and index_add_'s."""
    return coalesce_many([(rows, values)], limit)[0]


def _pointers(tensors: list[torch.Tensor]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


def _int64s(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


def coalesce_many(parts: list[tuple[torch.Tensor, torch.Tensor]],
                  limit: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``coalesce`` of each (rows, values) of ``parts`` (each ``coalescable``), in one call: the parts spread over the
    rank's threads, consecutive parts with the same rows tensor sorted once (kernels.c hl_coalesce_many). The
    results are views of a few buffers (one for every part's rows, the sums in blocks: ``_sum_blocks``), not two
    allocations a part."""
    return coalesce_checked(parts, limit)[0]


def coalesce_checked(parts: list[tuple[torch.Tensor, torch.Tensor]],
                     limit: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[bool]]:
    """``coalesce_many``, and per part whether every value of its sums is finite: the finiteness check of a step's
    gradients made by the same call, on sums it just wrote (one pass less over them, and no call of its own)."""
    count = len(parts)
    sizes = [r.shape[0] for r, _ in parts]
    dims = [v.shape[1] for _, v in parts]
    at_rows = list(itertools.accumulate(sizes, initial=0))
    unique = torch.empty(at_rows[-1], dtype=torch.int64)
    floats = [n * d for n, d in zip(sizes, dims)]
    blocks = _sum_blocks(floats)
    places = [(block, at) for block, first, end in blocks
              for at in list(itertools.accumulate(floats[first:end], initial=0))[:-1]]
    found, finite = (ctypes.c_int64 * count)(), (ctypes.c_int64 * count)()
    ok = _lib.hl_coalesce_many(count, _pointers([r for r, _ in parts]), _int64s(sizes),
                               _pointers([v for _, v in parts]), _int64s(dims),
                               _int64s([v.stride(0) for _, v in parts]), limit,
                               _int64s([unique.data_ptr() + 8 * a for a in at_rows[:-1]]),
                               _int64s([block.data_ptr() + 4 * at for block, at in places]),
                               found, finite, threads())
    if ok < 0:
        raise MemoryError("the table kernels could not allocate the coalesce's scratch")
    for (rows, _), k in zip(parts, found):
        _check(k, rows, limit)
    kept = [x for k, n in zip(found, sizes) for x in (k, n - k)]  # each part's rows, then the room it left
    if len(set(dims)) == 1 and dims[0]:  # one split a block (a view a part, made in one call)
        sums = [s for block, first, end in blocks for s in block.view(-1, dims[0]).split(kept[2 * first:2 * end])[::2]]
    else:
        sums = [block[at:at + k * d].view(k, d) for (block, at), d, k in zip(places, dims, found)]
    return list(zip(unique.split(kept)[::2], sums)), [bool(f) for f in finite]


BLOCK_SLACK = 4096
"""Bytes a sums block stays under MMAP_MAX by: what glibc and torch's 64-byte alignment add to the request."""


def _sum_blocks(floats: list[int]) -> list[tuple[torch.Tensor, int, int]]:
    """Where the parts' sums go (part i: ``floats[i]`` values): (a block, its first part, one past its last part)
    each. Consecutive parts share a block while it stays under MMAP_MAX bytes: glibc keeps such a block in its heap
    once it is freed, and the next step's coalesce reuses it. A block from MMAP_MAX up is mapped afresh and every page
    of it faulted as the sums are written (8 x 4 M x 64 at batch 16,384, one 32 MiB block: store.step() took 15.8 ms
    at one thread and 9.2 at two, 11.3 and 6.3 in blocks; docs/performance.md). A part of MMAP_MAX or more has a block
    of its own."""
    blocks: list[tuple[torch.Tensor, int, int]] = []
    first, total = 0, 0
    for i, n in enumerate([*floats, MMAP_MAX]):  # the last one closes the last block
        if i > first and (total + n) * 4 >= MMAP_MAX - BLOCK_SLACK:
            blocks.append((torch.empty(total), first, i))
            first, total = i, 0
        total += n
    return blocks


def gather(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (1-D int64) of a 2-D table, as torch.index_select(table, 0, rows) gives them."""
    out = table.new_empty(len(rows), table.shape[1])
    _check(_lib.hl_gather(table.data_ptr(), len(table), rows.data_ptr(), len(rows), table.shape[1], out.data_ptr(),
                          threads()), rows, len(table))
    return out


def pool_many(tables: list[torch.Tensor], keys: list[int], ids: torch.Tensor, offsets: torch.Tensor,
              bags: int) -> tuple[torch.Tensor, list[bool]]:
    """(the sums of each table's bags side by side: a (bags, sum of dims) tensor, per table whether each of its bags
    held one id): ``tables[f]``'s rows of the ids of key ``keys[f]``'s bags (a KeyedJaggedTensor's ``ids`` and
    ``offsets``, ``bags`` bags per key), summed in id order as ``index_add_`` sums them, every table in one call over
    the rank's threads (FBGEMM's table-batched forward). Each argument ``usable``; IndexError for an id out of range."""
    dims = [t.shape[1] for t in tables]
    out = hugepages.fresh(torch.empty(bags, sum(dims)))
    single = (ctypes.c_int64 * len(tables))()
    cols = [sum(dims[:f]) for f in range(len(dims))]
    bad = _lib.hl_pool_many(len(tables), _pointers(tables), _int64s([len(t) for t in tables]), _int64s(dims),
                            _int64s(keys), _int64s(cols), ids.data_ptr(), offsets.data_ptr(), bags, out.data_ptr(),
                            out.shape[1], single, threads())
    if bad:  # -(i + 1) for ids[i], of the first feature whose bags hold it
        f = next(f for f, k in enumerate(keys) if offsets[k * bags] <= -bad - 1 < offsets[(k + 1) * bags])
        _check(bad, ids, len(tables[f]))
    return out, [bool(x) for x in single]


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of every one of ``tensors`` is finite: the fp32 ones the kernels take in one call over the
    rank's threads (no temporary), any other with torch."""
    fast, other = [], []
    for t in tensors:
        (fast if t.dtype == torch.float32 and t.numel() and usable(t) else other).append(t)
    if fast and not _lib.hl_all_finite(len(fast), _pointers(fast), _int64s([t.numel() for t in fast]), threads()):
        return False
    return all(bool(torch.isfinite(t).all()) for t in other)


def threads() -> int:
    return torch.get_num_threads()


def job(rows: torch.Tensor, grads: torch.Tensor, tensors: tuple[torch.Tensor | None, ...],
        out: tuple[torch.Tensor | None, ...], constants: tuple[float, ...], flag0: int = 0, flag1: int = 0) -> bytes:
    """The packed ``JOB`` of one table's update: ``tensors`` the table and its states (None: none), ``out`` where
    their new values go (None or empty: in place), rows and grads (n, d) ``usable``, up to 8 constants and 2 flags.
    The caller keeps the tensors alive until the update ran."""
    at = [0 if t is None else t.data_ptr() for t in tensors] + [0] * (3 - len(tensors))
    to = [0 if t is None else t.data_ptr() for t in out] + [0] * (3 - len(out))
    fields = (*at, *to, rows.data_ptr(), grads.data_ptr(), tensors[0].shape[0], rows.shape[0], grads.shape[1])
    try:
        return JOB.pack(*fields, *constants, *_NO_CONSTANTS[len(constants):], flag0, flag1)
    except (OverflowError, struct.error):  # a constant past fp32's range: +-inf, as a C float assignment gives it
        fp32 = [math.copysign(math.inf, c) if abs(c) > FP32_MAX else c for c in constants]  # (a NaN stays)
        return JOB.pack(*fields, *fp32, *_NO_CONSTANTS[len(constants):], flag0, flag1)


def update_many(name: str, jobs: list[tuple[bytes, torch.Tensor]]) -> None:
    """Run update kernel ``name`` (one of UPDATES) on every (packed job, its rows tensor) in one call, their rows
    spread over the rank's threads as one range. IndexError, before anything is written, for a row out of its
    table."""
    bad = getattr(_lib, f"hl_{name}")(len(jobs), b"".join(j for j, _ in jobs), threads())
    if bad:  # -(i + 1) for the i-th row of all the jobs' rows in order
        at = -bad - 1
        for one, rows in jobs:
            fields = JOB.unpack(one)
            if at < fields[JOB_N]:
                _check(-at - 1, rows, fields[JOB_TABLE_ROWS])  # raises
            at -= fields[JOB_N]
