"""Host tables on transparent huge pages: a step's random rows of a table of gigabytes each cost a TLB miss and a page
walk with 4 KiB pages (two nested walks in a virtual machine); 2 MiB pages cover 512 times more rows per TLB entry.

``back(held)`` asks the kernel for huge pages under every host table and its optimizer states: ``madvise`` with
MADV_HUGEPAGE (pages faulted in later come huge), then MADV_COLLAPSE (Linux >= 6.1), which turns the pages already
there into huge ones in place, without a second copy of the table. The collapse copies the table once (~0.5 GB/s
on the 2-core VM of docs/performance.md), so it runs on a background thread, a chunk at a time, while training
goes on: nothing waits for it but ``Backing.wait`` (the benchmark's). A step taken while it copies is slow (wide_deep
at 1 M rows a table: 150-440 ms against 60-90, for the ~20 steps the move of 5 GB took), so what can be born on huge
pages is: a table's weight that torch.empty makes while the model is built (``born_huge``, around the model's
construction: nn.Embedding, nn.EmbeddingBag and TorchRec's tables make theirs so), a split table's block and every
optimizer state (``advised``, ``full``) are advised before they are first written, and the collapse finds them huge
already. Values never change, only the pages under them. Where the kernel says no (transparent huge pages ``never``,
an old kernel, pinned or fragmented memory) the pages stay as they were; ``Backing.huge_bytes`` says what was
collapsed, and each rank's stderr (rank.N/stderr) says it at the end of training.

launcher.native.pages_wanted decides whether (the host's setting, ``/sys/kernel/mm/transparent_hugepage/enabled``,
and ``HL_TABLE_HUGEPAGES``), and the plan's words come from the same place; ``HL_TABLE_HUGEPAGES=0`` leaves the
tables on the pages they have (a benchmark's baseline, a debugging run). bench/tbe_bench.py measures what it
changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading

import torch
from torch.overrides import TorchFunctionMode

from launcher.constants import MMAP_MAX
from launcher.native import pages_wanted

HUGE = 1 << 21
"""A transparent huge page on x86-64 and on arm64 with 4 KiB base pages."""
CHUNK = 64 << 20
"""Bytes collapsed per madvise call: the thread lets go of the kernel's locks between chunks."""
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


def _libc():
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.madvise.restype = ctypes.c_int
    return lib


def spans(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """(start, length) of the whole huge pages inside each CPU tensor's bytes (tensors under two huge pages: none)."""
    out = []
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() * t.element_size() < 2 * HUGE:
            continue
        start = t.data_ptr()
        first, end = -(-start // HUGE) * HUGE, (start + t.numel() * t.element_size()) // HUGE * HUGE
        if end > first:
            out.append((first, end - first))
    return out


class Backing:
    """The background collapse of a store's host tables (``back``)."""

    def __init__(self, regions: list[tuple[int, int]], keep: list[torch.Tensor]) -> None:
        self.regions, self.huge_bytes, self.error = regions, 0, ""
        self._keep = keep  # the tensors stay alive while their pages are advised
        self._thread = threading.Thread(target=self._run, name="hl-hugepages", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        libc = _libc()
        for start, length in self.regions:
            libc.madvise(start, length, MADV_HUGEPAGE)
            for at in range(start, start + length, CHUNK):
                size = min(CHUNK, start + length - at)
                if libc.madvise(at, size, MADV_COLLAPSE) == 0:
                    self.huge_bytes += size
                elif not self.error:
                    self.error = os.strerror(ctypes.get_errno())
        self._keep = []

    @property
    def bytes(self) -> int:
        """Bytes of the regions asked for."""
        return sum(length for _, length in self.regions)

    def words(self) -> str:
        """What moved, for the rank's log: 'host tables on huge pages: 1,536 of 1,600 MiB (...)'."""
        mib = f"{self.huge_bytes >> 20:,} of {self.bytes >> 20:,} MiB"
        why = f" (the kernel refused the rest: {self.error})" if self.error else \
            "" if self.huge_bytes == self.bytes else " (still moving)"
        return f"host tables on huge pages: {mib}{why}"

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the collapse to end; the bytes now on huge pages."""
        self._thread.join(timeout)
        return self.huge_bytes


MAPPED_ALWAYS = MMAP_MAX
"""glibc's malloc maps every block of this size or more afresh and unmaps it when freed (launcher/constants.py)."""


class _BornHuge(TorchFunctionMode):
    """``born_huge``'s mode: a CPU tensor torch.empty makes in one of ``shapes`` is advised as it is made."""

    def __init__(self, shapes: set[tuple[int, int]]) -> None:
        super().__init__()
        self.shapes = shapes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.empty and isinstance(out, torch.Tensor) and out.device.type == "cpu" \
                and tuple(out.shape) in self.shapes:
            _advise(out)
        return out


def born_huge(shapes: set[tuple[int, int]]) -> contextlib.AbstractContextManager:
    """Around a model's construction: the weights it makes with torch.empty in a host table's shape ((rows, dim) of
    ``shapes``) come on huge pages as they are initialised, when ``pages_wanted`` (else: nothing)."""
    return _BornHuge(shapes) if shapes and pages_wanted() else contextlib.nullcontext()


def _advise(t: torch.Tensor) -> torch.Tensor:
    """``t``'s whole huge pages advised MADV_HUGEPAGE: those not yet written come huge when they are."""
    libc = _libc()
    for start, length in spans([t]):
        libc.madvise(start, length, MADV_HUGEPAGE)
    return t


def fresh(t: torch.Tensor) -> torch.Tensor:
    """``t`` (just made, not yet written), its pages to come huge when first written if it is a block glibc maps
    afresh (MAPPED_ALWAYS): a 16,384 x 512 float forward output faulted 8,192 pages in a step; on huge pages
    ``hl_pool_many`` took 10.9 ms there, not 28.9 (bench/tbe_bench.py's 8 x 4 M x 64 shape, docs/performance.md)."""
    return advised(t) if t.numel() * t.element_size() >= MAPPED_ALWAYS else t


def advised(t: torch.Tensor) -> torch.Tensor:
    """``t`` (just made, not yet written), advised when it is on the CPU and ``pages_wanted``: it comes on huge pages
    as it is written, and the background collapse (``back``) has no copy of it left to make."""
    return _advise(t) if t.device.type == "cpu" and pages_wanted() else t


def full(shape: tuple[int, ...], value: float, like: torch.Tensor) -> torch.Tensor:
    """``torch.full(shape, value)`` with ``like``'s dtype and device, ``advised``: a table's optimizer state."""
    return advised(torch.empty(shape, dtype=like.dtype, device=like.device)).fill_(value)


def back(held: dict[str, tuple[str, torch.Tensor, list[torch.Tensor]]]) -> Backing | None:
    """Start backing the CPU tables and states of a store's ``held()`` with huge pages; None when not wanted here
    (launcher.native.pages_wanted) or nothing is large enough."""
    if not pages_wanted():
        return None
    tensors = [x for _, weight, states in held.values() for x in (weight, *states)]
    regions = spans(tensors)
    return Backing(regions, tensors) if regions else None
