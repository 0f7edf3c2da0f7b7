"""The forkserver's first preload: it leaves the launcher's session, so that a signal to the launcher's whole process
group (Ctrl-C, ``timeout``, a CI job's cancel, a closed terminal) reaches the launcher and not the forkserver.

The forkserver starts in the launcher's process group. Python's forkserver ignores SIGINT, but SIGTERM, SIGHUP and
SIGQUIT would end it; its ranks would then die by their parent-death signal, orphans the launcher cannot wait for,
recorded with exit code 255 (the forkserver could not report them) instead of as stopped by the launcher. In a
session of its own the forkserver only ends when the launcher does (its "alive" pipe closes) or when the run's end
stops it; the launcher stops the ranks on the signal as on a signal to its pid alone, the forkserver reports and
reaps them, and the launcher returns once they are gone (launcher/launch/supervise.py).

Listed before ``launcher.worker.warm`` (launcher/backends/warm_start.py): it runs within the forkserver's first
moments, before the seconds of importing torch. It acts only in a forkserver (anywhere else importing it does
nothing)."""

from __future__ import annotations

import os
import sys


def leave_session() -> None:
    """A new session for this process, when it is a forkserver (not already a group leader: setsid would fail)."""
    if sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules and os.getpgid(0) != os.getpid():
        os.setsid()


leave_session()
