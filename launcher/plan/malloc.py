"""PURE: the ranks' memory allocator (``launcher.malloc``): the variables a rank is started with, and the words the
plan says about it.

A training step frees what it made and makes the same again in the next step. glibc's malloc maps a block of 32 MiB
or more afresh at each request unless a free chunk of its heap is large enough, and hands it back when freed, so such
a block (a model's ``torch.cat`` of its lookups at a large batch, a lookup's output, an activation) faults and zeroes
all its pages again at every step; a step's smaller blocks it keeps as ``launcher/worker/heap.py`` sets it.
tcmalloc keeps every size it freed for reuse. Measured on the one-thread step of 8 tables of 4 M x 64 rows, batch
16,384 (bench/tbe_bench.py, docs/performance.md#tcmalloc-for-the-ranks): glibc 8,194 faults a step, tcmalloc none.

``auto`` preloads tcmalloc into a recipe's ranks where it is installed, as torch's own CPU launcher
(torch.backends.xeon.run_cpu) does by default, and keeps glibc's malloc elsewhere and for a script's ranks (which have
no Trainer to give tcmalloc's free memory back after each step: launcher/worker/heap.py release_hook); ``tcmalloc``
is refused where it is not installed; ``glibc`` keeps glibc's. The user's own choice wins: an allocator already in
LD_PRELOAD, or glibc's own variables set (then auto keeps glibc's, configured as the user configured it)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.plan.ranks import RankPlan
    from launcher.plan.types import HostFacts

CHOICES = ("auto", "tcmalloc", "glibc")
ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")
"""Allocators a user may preload themselves (their library's file names contain these)."""
GLIBC_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_CHECK_", "MALLOC_MMAP_MAX_",
                   "MALLOC_MMAP_THRESHOLD_", "MALLOC_PERTURB_", "MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_",
                   "GLIBC_TUNABLES")
"""glibc's own variables for its malloc (mallopt(3), tunables(7)): a user who set one chose glibc's malloc."""
INSTALL = "apt-get install libtcmalloc-minimal4 (Debian, Ubuntu) or conda install -c conda-forge gperftools"


def preloaded(preload: str) -> str:
    """The allocator an LD_PRELOAD value names ('' for none)."""
    names = [p.rsplit("/", 1)[-1] for p in preload.replace(" ", ":").split(":") if p]
    return next((a for a in ALLOCATORS for n in names if a in n), "")


def plan_malloc(choice: str, libs: tuple[tuple[str, str], ...], preload: str, glibc_vars: tuple[str, ...],
                script: bool = False) -> tuple[dict[str, str], str, list[str]]:
    """(variables for every rank, a note for the plan, problems) of ``launcher.malloc=choice`` on a host with the
    allocators ``libs`` ((name, path): launcher/facts/malloc.py), the launcher's LD_PRELOAD ``preload`` (the ranks
    inherit it) and glibc's malloc variables ``glibc_vars`` set in its environment. ``script``: the ranks run a
    user's script, which has no Trainer to give tcmalloc's free memory back after each step (heap.release_hook): auto
    keeps what ``python script.py`` has there."""
    if choice not in CHOICES:
        return {}, "", [f"launcher.malloc={choice} is not one of {', '.join(CHOICES)}. Use launcher.malloc=auto "
                        f"(tcmalloc where installed, else glibc's malloc), tcmalloc or glibc."]
    theirs, found = preloaded(preload), dict(libs)
    if theirs:
        if choice != "auto" and choice != theirs:
            return {}, "", [f"launcher.malloc={choice}, but LD_PRELOAD={preload} in the launcher's environment "
                            f"preloads {theirs} into every rank. Leave launcher.malloc out (auto keeps your "
                            f"LD_PRELOAD), or unset LD_PRELOAD."]
        return {}, f"malloc: the ranks keep your LD_PRELOAD ({theirs}); launcher.malloc leaves it as it is", []
    if choice == "tcmalloc" and "tcmalloc" not in found:
        return {}, "", [f"launcher.malloc=tcmalloc, but this host has no tcmalloc library (libtcmalloc_minimal.so.4 "
                        f"or libtcmalloc.so.4 under /usr/lib, /usr/local/lib or this environment's lib). Install it "
                        f"({INSTALL}), or use launcher.malloc=auto (glibc's malloc where tcmalloc is missing)."]
    if choice == "auto" and script:
        return {}, ("malloc: a script's ranks keep glibc's, as `python script.py` has it (launcher.malloc=tcmalloc "
                    "preloads tcmalloc; nothing then gives its free memory back after a step)"), []
    if choice == "glibc" or (choice == "auto" and glibc_vars) or "tcmalloc" not in found:
        return {}, _glibc_note(choice, glibc_vars), []
    path = found["tcmalloc"]
    env = {"LD_PRELOAD": ":".join(p for p in (path, preload) if p)}
    return env, (f"malloc: every rank preloads tcmalloc ({path}), as torch's CPU launcher does: a step's blocks are "
                 f"reused instead of mapped and faulted afresh (launcher.malloc=glibc keeps glibc's malloc)"), []


def _glibc_note(choice: str, glibc_vars: tuple[str, ...]) -> str:
    if glibc_vars:
        return f"malloc: glibc's, with your {', '.join(glibc_vars)}"
    if choice == "glibc":
        return "malloc: glibc's (launcher.malloc=glibc), set to keep a step's blocks under 32 MiB for the next step"
    return (f"malloc: glibc's, set to keep a step's blocks under 32 MiB for the next step; tcmalloc, which keeps "
            f"larger ones too, is not installed here ({INSTALL})")


def with_malloc(ranks: tuple[RankPlan, ...], choice: str, host: HostFacts,
                script: bool = False) -> tuple[tuple, list[str], list[str]]:
    """(``ranks`` with the allocator's variables added, problems, notes) of ``launcher.malloc=choice`` on ``host``
    (``script``: as plan_malloc's)."""
    env, note, problems = plan_malloc(choice, host.malloc_libs, host.preload, host.malloc_vars, script)
    ranks = tuple(dataclasses.replace(r, env={**r.env, **env}) for r in ranks) if env else ranks
    return ranks, problems, [note] if note else []
