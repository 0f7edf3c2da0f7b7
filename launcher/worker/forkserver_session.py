"""The forkserver's first preload: it leaves the launcher's session, so that a signal to the launcher's whole process
group (Ctrl-C, ``timeout``, a CI job's cancel, a closed terminal) reaches the launcher and not the forkserver.

The forkserver starts in the launcher's process group. Python's forkserver ignores SIGINT, but SIGTERM, SIGHUP and
SIGQUIT would end it; its ranks would then die by their parent-death signal, orphans the launcher cannot wait for,
recorded with exit code 255 (the forkserver could not report them) instead of as stopped by the launcher. In a session
of its own the forkserver only ends when the launcher does (its "alive" pipe closes) or when a later run needs other
variables (launcher/backends/warm_start.py); the launcher stops the ranks on the signal as on a signal to its pid alone,
the forkserver reports and reaps them, and the launcher returns once they are gone (launcher/launch/supervise.py).

It also asks the kernel for SIGKILL when the launcher dies (``lifeline.die_with_parent``; the launcher's pid comes in
``lifeline.FORKSERVER_PARENT_ENV``, taken out of ``os.environ`` so that no rank's program sees it; /proc still shows it
in the environment of every process forked from here, which is how the launcher tells them at a run's end,
launcher/launch/supervise.py): a launcher killed outright (SIGKILL, the OOM killer) while the forkserver still imports
torch would otherwise leave it importing for seconds before it read its pipe's end. Its ranks then die by their own
parent-death signal.

Listed before ``launcher.worker.warm`` (launcher/backends/warm_start.py): it runs within the forkserver's first
moments, before the seconds of importing torch. It acts only in a forkserver (anywhere else importing it does
nothing)."""

from __future__ import annotations

import os
import signal
import sys

from launcher import lifeline  # imports nothing heavy


def leave_session() -> None:
    """A new session for this process, when it is a forkserver (not already a group leader: setsid would fail), and
    death with the launcher that started it."""
    if sys.argv[:1] != ["-c"] or "multiprocessing.forkserver" not in sys.modules:
        return
    if os.getpgid(0) != os.getpid():
        os.setsid()
    parent = os.environ.pop(lifeline.FORKSERVER_PARENT_ENV, "")
    if parent.isdigit():
        lifeline.die_with_parent(int(parent), signal.SIGKILL)


leave_session()
