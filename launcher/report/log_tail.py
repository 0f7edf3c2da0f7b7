"""The end of a rank's log as a report shows it: read from its last bytes only, a rewritten line as its last state,
no terminal codes, each line and the whole tail cut to a size a terminal and a junit file take."""

from __future__ import annotations

import os
import re
from pathlib import Path

from launcher.errors import printable

TAIL_READ_BYTES = 64 * 1024
"""How much of the end of a rank's stderr (or backend.log) a report reads: never the whole file."""
LINE_CHARS = 2000
"""A tail line longer than this keeps its first and last LINE_CHARS // 2 characters (a progress bar that never wrote a
newline, a tensor printed whole)."""
TAIL_CHARS = 8000
"""The tail's lines together; the oldest are left out beyond this."""
MESSAGE_CHARS = 4000
"""A rank's error message (error.json) as a report shows it, cut in the middle beyond this."""


def cut_middle(text: str, limit: int) -> str:
    """``text`` with its middle left out (and said so) when it is longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} …[{len(text) - limit} characters left out]… {text[-(limit // 2):]}"


_TERMINAL_CODES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
"""A terminal's colour, cursor and title sequences (CSI and OSC): formatting, no text."""


def log_tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a log as a report shows them, read from its last TAIL_READ_BYTES only: a line
    rewritten with carriage returns (a tqdm bar) as its last state, without terminal colour and cursor codes, other
    control characters escaped (errors.printable), each line cut to LINE_CHARS and all of them to TAIL_CHARS (the
    oldest left out first). [] when unreadable."""
    try:
        with open(path, "rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - TAIL_READ_BYTES)
            f.seek(start)
            data = f.read(TAIL_READ_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").split("\n")
    if text[-1] == "":
        text.pop()  # the file ends with a newline
    out = [printable(_TERMINAL_CODES.sub("", next((seg for seg in reversed(line.split("\r")) if seg), "")))
           for line in text[max(0, len(text) - lines):]]
    if start > 0 and out and len(text) <= lines:
        out[0] = f"…{out[0]}"  # the end of a line that began before what was read
    out = [cut_middle(line, LINE_CHARS) for line in out]
    kept, size = [], 0
    for line in reversed(out):
        size += len(line) + 1
        if size > TAIL_CHARS and kept:
            kept.append(f"…[{len(out) - len(kept)} earlier line(s) left out: the tail is cut to {TAIL_CHARS} "
                        f"characters]")
            break
        kept.append(line)
    return kept[::-1]
