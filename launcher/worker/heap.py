"""A rank's freed memory kept for its next step: glibc's malloc told not to hand it back to the kernel at once.

A training step frees what it made (activations, gradients, a lookup's rows, the coalesce's sums) and makes the
same again in the next step. By default glibc gives a freed block back to the kernel when more than a few tens of
MiB sit free at the top of its heap (its trim threshold follows the largest mapped block freed, at most 64 MiB), so
the next step's blocks come as fresh pages: every 4 KiB page faulted and zeroed by the kernel, step after step.
wide_deep at 1 M rows a table, one rank on the 2-core VM of docs/performance.md, 3 interleaved pairs of runs: the
tables' part of a step (coalesce, update) took 8.7-12.4 ms with glibc's defaults and 7.5-9.2 ms with the settings here
(torch's CPU launcher, torch.backends.xeon.run_cpu, preloads jemalloc or tcmalloc for the same reason).

``keep_freed_memory`` sets two of glibc's documented knobs (mallopt(3)) in the rank's process:
- M_TRIM_THRESHOLD 256 MiB: up to this much free memory at the top of the heap stays with the process;
- M_MMAP_THRESHOLD 32 MiB, the bound glibc's own moving threshold stops at: a block from 32 MiB up is still mapped
  afresh and handed back when freed (a table, a state: ``launcher.constants.MMAP_MAX``), smaller
  blocks come from the heap from the first step on.
The memory kept is at most the threshold a process: what a step frees is what the next one makes again.

Blocks of 32 MiB and more it still maps and faults afresh at each step (the highest threshold glibc accepts): where
tcmalloc is installed the plan preloads it instead (launcher/plan/malloc.py), which reuses every size.

Left alone when the user chose: any of glibc's own variables for its malloc (MALLOC_TRIM_THRESHOLD_,
MALLOC_ARENA_MAX, GLIBC_TUNABLES, ...: launcher.plan.malloc.GLIBC_VARIABLES); when another allocator runs in the
process (tcmalloc, or the user's jemalloc or mimalloc), seen in /proc/self/maps, not in LD_PRELOAD alone (a host
that lacks the library named there runs glibc's: the dynamic loader skips it with a line on stderr); and off the GNU
C library (musl, macOS), where these calls do not exist.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path

from launcher.constants import MMAP_MAX
from launcher.plan.malloc import GLIBC_VARIABLES, preloaded

TRIM_THRESHOLD = 256 << 20
MMAP_THRESHOLD = MMAP_MAX
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""mallopt's parameter numbers (malloc.h)."""


def _maps() -> str:
    """This process's /proc/self/maps ('' where there is none)."""
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def running_allocator(maps: str | None = None) -> str:
    """The path of the allocator of ALLOCATORS loaded in this process ('' for none): from ``maps``, the text of
    /proc/self/maps (read when None)."""
    if maps is None:
        maps = _maps()
    paths = {line.split()[-1] for line in maps.splitlines() if line.count(" ") >= 5 and "/" in line}
    return next((p for p in sorted(paths) if preloaded(p)), "")


def left_alone(environ: Mapping[str, str], maps: str | None = None) -> str:
    """Why the rank's malloc is not set here ('' when it is to be): another allocator runs, the user's own
    settings, or not glibc. ``maps``: as running_allocator's."""
    running = running_allocator(maps)
    if running:
        return f"{preloaded(running)} runs: {running}"
    own = [v for v in GLIBC_VARIABLES if v in environ]
    if own:
        return f"{own[0]} is set"
    if platform.libc_ver()[0] != "glibc":
        return "not the GNU C library"
    return ""


def keep_freed_memory(environ: Mapping[str, str] | None = None, maps: str | None = None) -> str:
    """Set the rank's malloc as the module says, unless ``left_alone``; returns the words for the rank's log (they
    say when LD_PRELOAD names an allocator this process has not loaded)."""
    environ = os.environ if environ is None else environ
    maps = _maps() if maps is None else maps  # read once: running_allocator and left_alone both look
    running = running_allocator(maps)
    if running:
        return f"malloc: {preloaded(running)} ({running})"
    why = left_alone(environ, maps)
    if why:
        return f"malloc left as it is ({why})"
    named = preloaded(environ.get("LD_PRELOAD", ""))
    if named:
        return f"{named} is in LD_PRELOAD but not loaded (not on this host?): " + _set_glibc()
    return _set_glibc()


def _set_glibc() -> str:
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "malloc left as it is (glibc refused mallopt)"
    return (f"malloc keeps up to {TRIM_THRESHOLD >> 20} MiB of freed memory for the next step, blocks under "
            f"{MMAP_THRESHOLD >> 20} MiB from its heap (launcher/worker/heap.py)")


def release_hook(maps: str | None = None) -> Callable[[], None] | None:
    """Where tcmalloc runs (``maps``: as running_allocator's): a function for the end of each step that gives the
    kernel back what tcmalloc holds free beyond TRIM_THRESHOLD, as glibc's trim threshold is set here. tcmalloc keeps
    every freed block, so a table or a state freed once (moved onto huge pages, replaced by a checkpoint's) would stay
    resident beside its successor: a 2 GiB tensor freed left RSS at 2 GiB. What a step frees and the next makes again
    stays under the threshold and is kept. None where tcmalloc does not run, or lacks gperftools' C API."""
    if "tcmalloc" not in running_allocator(maps):
        return None
    lib = ctypes.CDLL(None)
    try:
        free_bytes, release = lib.MallocExtension_GetNumericProperty, lib.MallocExtension_ReleaseToSystem
    except AttributeError:
        return None
    free_bytes.argtypes, free_bytes.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int
    release.argtypes, release.restype = [ctypes.c_size_t], None
    held = ctypes.c_size_t()

    def give_back() -> None:
        if free_bytes(b"tcmalloc.pageheap_free_bytes", ctypes.byref(held)) and held.value > TRIM_THRESHOLD:
            release(held.value - TRIM_THRESHOLD)
    return give_back
