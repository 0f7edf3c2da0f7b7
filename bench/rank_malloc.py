"""A bench process's allocator set as a recipe rank's: ``launcher.malloc`` planned for this host
(launcher/plan/malloc.py), then, where that preloads tcmalloc, this process started again with it (a library is
preloaded only when a process starts); then glibc's settings where glibc's malloc stays (launcher/worker/heap.py).

    import rank_malloc
    print(rank_malloc.as_a_rank("auto"))   # first thing in main(): the words a rank's log has about its malloc
    ...
    rank_malloc.step_end()                 # after each step, as a rank's Trainer calls it
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.errors import ConfigError  # noqa: E402
from launcher.facts.malloc import find_allocators, glibc_settings  # noqa: E402
from launcher.plan.malloc import plan_malloc  # noqa: E402
from launcher.worker.heap import keep_freed_memory, release_hook, running_allocator  # noqa: E402

_give_back = None


def step_end() -> None:
    """What a rank's Trainer calls after each step (heap.release_hook: tcmalloc's free memory beyond 256 MiB back to
    the kernel); nothing before as_a_rank or where glibc's malloc runs."""
    if _give_back is not None:
        _give_back()


AGAIN = "HL_BENCH_STARTED_AGAIN"
"""Set in the process started again: it never starts a third."""


def as_a_rank(choice: str = "auto") -> str:
    """Plan ``launcher.malloc=choice`` here; start this process again (os.execve: same pid, same arguments) when the
    plan preloads an allocator this process lacks; returns the rank's words about its malloc."""
    env, _, problems = plan_malloc(choice, find_allocators(), os.environ.get("LD_PRELOAD", ""), glibc_settings())
    if problems:
        raise ConfigError(problems)
    if env and not running_allocator() and AGAIN not in os.environ:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env, AGAIN: "1"})
    global _give_back
    _give_back = release_hook()
    return keep_freed_memory()
