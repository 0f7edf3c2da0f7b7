"""A rank's malloc keeps what a step frees for the next (launcher/worker/heap.py): measured by the page faults of a
step-like pattern (blocks made, written and freed together, again and again) in a fresh process, with glibc's
defaults and after ``keep_freed_memory``; and the user's own choice of allocator settings is left alone."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.worker.heap import keep_freed_memory, left_alone

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
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc is preloaded (LD_PRELOAD)"),
])
def test_the_users_own_allocator_settings_are_left_alone(environ, why):
    assert left_alone(environ) == why
    assert keep_freed_memory(environ) == f"malloc left as it is ({why})"


def test_nothing_set_means_the_rank_is_set_on_glibc():
    assert left_alone({"LD_PRELOAD": "libfoo.so"}) == ("" if platform.libc_ver()[0] == "glibc"
                                                        else "not the GNU C library")
