"""The quiet-script notice (launcher/launch/quiet.py) on real processes: a rank that computes without writing a line
is working, one that sleeps without writing is waiting; only a spell in which every rank waits is said, once."""

import io
import subprocess
import sys
import time

from rich.console import Console

from launcher.launch.quiet import QuietScriptWatch
from launcher.rundir import RunDir


def _watch(tmp_path, procs, limit_s=1.0, seconds=2.6):
    out = io.StringIO()
    watch = QuietScriptWatch(RunDir(tmp_path), lambda: {r: p.pid for r, p in enumerate(procs)}, limit_s,
                             Console(file=out, width=300), every_s=0.1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watch.tick()
        time.sleep(0.05)
    return watch.said, out.getvalue()


def test_only_ranks_that_all_wait_are_said(tmp_path):
    busy = [sys.executable, "-c", "while True: pass"]  # silent, but computing
    idle = [sys.executable, "-c", "import time; time.sleep(60)"]
    for commands, said in (([busy, idle], 0), ([idle, idle], 1)):
        procs = [subprocess.Popen(c, start_new_session=True) for c in commands]
        try:
            time.sleep(0.5)  # past the interpreter's start
            got, text = _watch(tmp_path, procs)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        assert got == said, (commands, got, text)
        if said:
            assert "no rank of this script has written a line or used the CPU for 1 s" in " ".join(text.split())
    procs = [subprocess.Popen(idle, start_new_session=True)]
    try:
        assert _watch(tmp_path, procs, limit_s=0)[0] == 0  # launcher.watchdog_s=0: never
    finally:
        procs[0].kill()
        procs[0].wait()
