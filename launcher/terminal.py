"""The launcher's console: output that can never stop a run.

A launcher's reader may go away while the ranks train: ``| head`` exits, a CI log pipe closes, the ssh session that
held the terminal drops (EIO), ``| tee log`` dies with the same Ctrl-C. rich would end the process on a broken pipe
(``SystemExit(1)``) and raise ``OSError`` on a terminal that is gone, from inside a progress tick. Here the stream
under the console swallows the error instead: from then on, what would have been printed is dropped (its file
descriptor is pointed at /dev/null, so no other writer trips on it either), and the run goes on to its end, its
summary and its exit code. The run dir holds everything the console would have shown.

Also the shapes that keep a view readable on a narrow terminal: a line cut with … instead of wrapped
(``one_line``), a table whose rows stay one line each (``one_line_table``), and plain text for a file
(``plain_text``)."""

from __future__ import annotations

import io
import os
import sys
from contextlib import suppress
from typing import Sequence, TextIO

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.highlighter import ReprHighlighter
from rich.table import Table
from rich.text import Text


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
        # later writers of the same descriptor (a warning, the interpreter's last flush) write to nowhere
        with suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

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


_HIGHLIGHT = ReprHighlighter()


def one_line(text: str | Text, style: str = "") -> Text:
    """``text`` kept on one line at whatever width it is shown: cut with … (where the full text is kept, a file of the
    run dir, is for the caller to say), highlighted as rich highlights a printed string. Never read as markup."""
    line = text.copy() if isinstance(text, Text) else Text(text, style=style)
    if "\n" in line.plain:  # a name with a newline in it (from the user's data) stays on the line too
        line = Text(" ").join(line.split("\n", allow_blank=True))
    line.no_wrap, line.overflow = True, "ellipsis"
    return _HIGHLIGHT(line)


def one_line_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int,
                   shrink: Sequence[int] = (), optional: Sequence[int] = ()) -> Group:
    """A table whose title and rows are one line each at ``width`` columns. When the cells are wider than that, the
    ``optional`` columns go first (in that order), then the ``shrink`` columns (the widest first, down to
    SHRINK_FLOOR) are cut with …; the others stay whole. Cells never wrap into a column too narrow to read. No
    borders but a rule under the header."""
    keep = list(range(len(columns)))
    widths = {i: max([cell_len(c), *(cell_len(r[i]) for r in rows)]) for i, c in enumerate(columns)}

    def excess() -> int:  # one space, a divider and one space between columns
        return sum(widths[i] for i in keep) + 3 * (len(keep) - 1) - width

    for i in optional:
        if excess() <= 0:
            break
        keep.remove(i)
    over = excess()
    while over > 0 and (cut := [i for i in shrink if i in keep and widths[i] > SHRINK_FLOOR]):
        widths[max(cut, key=lambda k: widths[k])] -= 1
        over -= 1  # when none is left to cut, rich cuts every column alike: still one line each
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in keep:
        table.add_column(columns[i], no_wrap=True, overflow="ellipsis", max_width=widths[i] if i in shrink else None)
    for row in rows:
        table.add_row(*(Text(row[i].replace("\n", " ")) for i in keep))
    return Group(one_line(title), table)  # the title on a line of its own: cut at the console's width, not the table's


SHRINK_FLOOR = 8
"""The narrowest a shrinking column of one_line_table gets (its cells cut with … to this many characters)."""


def plain_text(renderables: Sequence[RenderableType], width: int) -> str:
    """What a console ``width`` columns wide prints of ``renderables``, without colours or styles (for a file): a
    table at its natural width (up to WIDEST), so that its rows stay whole."""
    out = io.StringIO()
    console = Console(file=out, width=WIDEST, color_system=None, force_terminal=False, highlight=False,
                      legacy_windows=False)
    for r in renderables:
        natural = console.measure(r).maximum if isinstance(r, Table) else width
        console.print(r, width=max(width, natural))
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())  # no title padded to its table


WIDEST = 200
"""The widest plain_text lets a table be."""
