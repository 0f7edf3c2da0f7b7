"""Ranks never outlive their launcher: the kernel's parent-death signal, set in a process's first moments.

``python -m launcher.lifeline <parent pid> <signal> -- <program> [args ...]`` asks the kernel
(``prctl(PR_SET_PDEATHSIG)``) to send ``signal`` to this process when its parent dies, checks that the parent is
still ``<parent pid>`` (had it died before the request, this process was already re-parented and no signal would
ever come: it ends at once), then replaces itself with the program (``execv``: same process, and the request stays
through it). The launcher starts its own ranks this way (SIGKILL: a rank stuck in a collective cannot ignore it) and
mpirun / srun too (SIGTERM: they stop their ranks on every host before they go); ``rank_start`` asks the same for
the rank it starts. So a launcher killed by any signal, SIGKILL and the OOM killer included, takes its job with it.

On a system without prctl (not Linux) the request is skipped: the launcher's own signal handling is all there is.
It imports nothing heavy: it is in every rank's start-up time."""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""prctl option: the signal this process gets when its parent (the thread that started it) ends."""
FORKSERVER_PARENT_ENV = "HL_FORKSERVER_PARENT"
"""The launcher's pid, in the warm start's forkserver's environment when it starts (launcher/backends/warm_start.py),
so that the forkserver asks for this signal against it (launcher/worker/forkserver_session.py)."""
LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""Signals that end a run as interrupted (every rank stopped, the summary written; exit 128 + the signal), as SIGINT
does: each an exception in the launcher (launcher/launch/__init__.py), not its death. SIGUSR1/2 too, which Slurm's
--signal sends before a time limit (the launcher's own default would be to die on the spot, its ranks left)."""


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask for ``sig`` when the parent dies; end now (as killed by sig) when the parent is no longer ``parent``."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):  # no prctl here
        return
    if os.getppid() != parent:  # the parent ended before the request: nothing would ever tell this process
        os._exit(128 + int(sig))


def command(parent: int, sig: int, argv: list[str]) -> list[str]:
    """argv, started so that it gets sig when ``parent`` (the process that starts it) dies."""
    return [sys.executable, "-m", "launcher.lifeline", str(parent), str(int(sig)), "--", *argv]


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--" or not argv[0].isdigit() or not argv[1].isdigit():
        sys.exit("usage: python -m launcher.lifeline <parent pid> <signal> -- <program> [args ...]")
    die_with_parent(int(argv[0]), int(argv[1]))
    program = argv[3]
    try:
        os.execvp(program, argv[3:])
    except OSError as e:
        sys.exit(f"hetero-launch: cannot start {program}: {e.strerror or e}")


if __name__ == "__main__":
    main(sys.argv[1:])
