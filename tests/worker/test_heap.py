"""A rank's malloc keeps what a step frees for the next (launcher/worker/heap.py): measured by the page faults of a
step-like pattern (blocks made, written and freed together, again and again) in a fresh process, with glibc's
defaults and after ``keep_freed_memory``; and the user's own choice of allocator settings is left alone."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.facts.malloc import find_allocators
from launcher.worker.heap import keep_freed_memory, left_alone, running_allocator

ROOT = Path(__file__).resolve().parents[2]

STEPS = '''
import ctypes, json, resource, sys
from launcher.worker.heap import keep_freed_memory
words = keep_freed_memory({}) if sys.argv[1] == "kept" else ""
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def step():  # 24 blocks of 6 MiB (a step's activations and rows), written, then all freed
    blocks = [libc.malloc(6 << 20) for _ in range(24)]
    for b in blocks:
        ctypes.memset(b, 1, 6 << 20)
    for b in blocks:
        libc.free(b)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(json.dumps({"faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5, "words": words}))
'''


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    return json.loads(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are the GNU C library's")
def test_a_step_after_the_first_faults_no_pages_where_glibc_faults_them_all():
    default, kept = _faults("default"), _faults("kept")
    pages = 24 * (6 << 20) // 4096
    assert default["faults"] > pages / 2, default  # glibc's defaults: the freed blocks went back to the kernel
    assert kept["faults"] < pages / 50, kept
    assert "256 MiB of freed memory" in kept["words"]


@pytest.mark.parametrize("environ, why", [
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_ is set"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES is set"),
])
def test_the_users_own_allocator_settings_are_left_alone(environ, why):
    assert left_alone(environ, maps="") == why
    assert keep_freed_memory(environ, maps="") == f"malloc left as it is ({why})"


JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
MAPS = f"""7f00a0000000-7f00a0020000 r--p 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00a1000000-7f00a1080000 r-xp 00010000 fd:01 5678 {JEMALLOC}
7f00a2000000-7f00a2100000 rw-p 00000000 00:00 0 [heap]
"""


def test_an_allocator_running_in_the_process_is_left_alone_whatever_the_environment_says():
    assert running_allocator(MAPS) == JEMALLOC
    assert left_alone({}, maps=MAPS) == f"jemalloc runs: {JEMALLOC}"
    assert keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0"}, maps=MAPS) == f"malloc: jemalloc ({JEMALLOC})"
    assert running_allocator(MAPS.replace(JEMALLOC, "/usr/lib/x86_64-linux-gnu/libm.so.6")) == ""
    assert running_allocator("") == ""


def test_nothing_set_means_the_rank_is_set_on_glibc():
    assert left_alone({"LD_PRELOAD": "libfoo.so"}) == ("" if platform.libc_ver()[0] == "glibc"
                                                        else "not the GNU C library")


CAT = '''
import ctypes, json, resource, sys
from launcher.worker.heap import keep_freed_memory, release_hook
words = keep_freed_memory()
step_end = release_hook() or (lambda: None)  # as the Trainer calls it after each step
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def step():  # 8 lookups of 4 MiB, then, while they live, their concatenation: 32 MiB (a block glibc maps afresh)
    blocks = [libc.malloc(4 << 20) for _ in range(8)]
    blocks.append(libc.malloc(32 << 20))
    for b, n in zip(blocks, [4 << 20] * 8 + [32 << 20]):
        ctypes.memset(b, 1, n)
    for b in blocks:
        libc.free(b)
    step_end()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
for _ in range(2):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
def table_freed():  # a table (torch aligns its blocks: posix_memalign), moved elsewhere and freed at a step's end
    table = ctypes.c_void_p()
    libc.posix_memalign(ctypes.byref(table), 64, 1 << 30)
    ctypes.memset(table.value, 1, 1 << 30)
    with_table = rss()
    libc.free(table.value)
    step_end()
    return with_table - rss()
table_freed()  # tcmalloc gives the first one back by itself
print(json.dumps({"faults": faults, "words": words, "freed": table_freed()}))
'''


def _cat_faults(preload: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **({"LD_PRELOAD": preload} if preload else {})}
    out = subprocess.run([sys.executable, "-c", CAT], capture_output=True, text=True, check=True, env=env, cwd=ROOT)
    return {**json.loads(out.stdout), "stderr": out.stderr}


TCMALLOC = dict(find_allocators()).get("tcmalloc", "")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are the GNU C library's")
@pytest.mark.skipif(not TCMALLOC, reason="tcmalloc is not installed (apt-get install libtcmalloc-minimal4)")
def test_tcmalloc_reuses_a_steps_32_mib_block_where_glibc_maps_and_faults_it_at_every_step():
    """launcher/plan/malloc.py's reason to preload tcmalloc: glibc, even as heap.py sets it, faults the 32 MiB block's
    8,192 pages at every step (its heap has no free chunk that large while the lookups live); tcmalloc none, with
    release_hook called after each step as the Trainer calls it, which still gives back a freed GiB (tcmalloc alone
    would keep it). A name in LD_PRELOAD that this host lacks leaves the process on glibc, set as heap.py sets it, and
    its words say so."""
    glibc, tc = _cat_faults(""), _cat_faults(TCMALLOC)
    missing = _cat_faults("/nonexistent/libtcmalloc_minimal.so.4")
    assert glibc["faults"] > 8192 * 0.9, glibc
    assert "256 MiB of freed memory" in glibc["words"]
    assert tc["faults"] < 100, tc
    for run in (glibc, tc, missing):  # the freed GiB: glibc unmaps it; tcmalloc keeps it, release_hook gives it back
        assert run["freed"] > 0.9 * (1 << 30), run
    assert tc["words"].startswith("malloc: tcmalloc (/") and "libtcmalloc" in tc["words"], tc
    assert missing["words"].startswith("tcmalloc is in LD_PRELOAD but not loaded (not on this host?): malloc keeps")
    assert missing["faults"] > 8192 * 0.9, missing
