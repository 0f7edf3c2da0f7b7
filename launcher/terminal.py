"""The launcher's console: output that can never stop a run.

A launcher's reader may go away while the ranks train: ``| head`` exits, a CI log pipe closes, the ssh session that
held the terminal drops (EIO), ``| tee log`` dies with the same Ctrl-C. rich would end the process on a broken pipe
(``SystemExit(1)``) and raise ``OSError`` on a terminal that is gone, from inside a progress tick. Here the stream
under the console swallows the error instead: from then on, what would have been printed is dropped (its file
descriptor is pointed at /dev/null, so no other writer trips on it either), and the run goes on to its end, its
summary and its exit code. The run dir holds everything the console would have shown.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console


class SafeStream:
    """A text stream that turns a write or flush error (EPIPE, EIO, ...) into silence, once and for all."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lost: OSError | None = None
        """The error that ended the output (None while it works)."""

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self._stream.write(text)
            except OSError as e:
                self._lose(e)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._stream.flush()
            except OSError as e:
                self._lose(e)

    def _lose(self, error: OSError) -> None:
        self.lost = error
        try:  # later writers of the same descriptor (a warning, the interpreter's last flush) write to nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def isatty(self) -> bool:
        try:
            return self.lost is None and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"


def launcher_console(stderr: bool = False) -> Console:
    """A rich Console on stdout (or stderr) that never raises for a reader that went away."""
    return Console(file=SafeStream(sys.stderr if stderr else sys.stdout), stderr=stderr)  # type: ignore[arg-type]
