"""A script= rank: ``python -m launcher.worker.script <script.py> [args ...]`` runs the user's script as ``python
<script.py> [args ...]`` would, then leaves the way a recipe's rank does (``launcher.fastexit``).

Why not ``python script.py``: at the end of a script that used a gloo process group, the interpreter's teardown
destroys gloo's threads while a peer may still be talking to this rank, and the rank dies of SIGABRT ("terminate
called without an active exception", pytorch#179291) after its work is done: the launcher then reports a crash, or
restarts a finished job. Here the script's own exit (its return, ``sys.exit(n)``, an exception) becomes the rank's
exit code without that teardown.

What stays as ``python script.py``: ``__name__ == "__main__"``, ``sys.argv``, the script's folder first on
``sys.path``, atexit handlers (run by ``fast_exit``), non-daemon threads joined before the exit, an exception's
traceback on stderr with exit 1. ``KeyboardInterrupt`` and other non-``Exception`` errors leave through the
interpreter as usual. torch elastic's error handler (what ``@record`` uses) also writes an exception to ``rank.N/error.json`` for the
launcher's failure report, as for a recipe's rank."""

from __future__ import annotations

import os
import runpy
import sys
import threading
from types import TracebackType

from launcher.fastexit import fast_exit

USAGE = "usage: python -m launcher.worker.script <script.py> [args ...]"


def exit_code(e: SystemExit) -> int:
    """The status ``python`` gives ``sys.exit(e.code)``: None 0, an int itself, anything else printed and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def join_threads() -> None:
    """What the interpreter does before atexit: wait for the script's non-daemon threads (an upload, a writer)."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def from_script(tb: TracebackType | None, script: str) -> TracebackType | None:
    """The traceback from the script's first frame on (this entry's and runpy's frames are not the user's)."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != script:
        first = first.tb_next
    return first or tb


_KEPT: list[object] = []
"""The script's globals (or the exception whose traceback holds them), alive until the process ends as under
``python script.py``: dropping them would destroy the script's objects (a DDP model, a process group's users) while
gloo's threads still run, the very teardown this entry skips."""


def run_script(argv: list[str]) -> int:
    """Run ``argv[0]`` as ``__main__`` with ``sys.argv = argv``; its exit status."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    errors = get_error_handler()  # what torch elastic's @record uses: error.json for the launcher's failure report
    errors.initialize()
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)  # runpy puts the absolute path in argv[0]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` puts it (here: the cwd of `-m`)

    try:
        _KEPT.append(runpy.run_path(script, run_name="__main__"))
    except SystemExit as e:
        _KEPT.append(e)  # its traceback holds the script's frames, and so its globals
        return exit_code(e)
    except Exception as e:  # noqa: BLE001 - the script's own error: shown as python shows it, exit 1
        _KEPT.append(e)
        e.__traceback__ = from_script(e.__traceback__, script)
        errors.record_exception(e)  # rank.N/error.json (TORCHELASTIC_ERROR_FILE), as @record writes it
        sys.excepthook(type(e), e, e.__traceback__)  # as the interpreter shows it (a hook the script set included)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(USAGE)
    code = run_script(sys.argv[1:])
    join_threads()
    fast_exit(code)
