"""output.console: a script= run's rank 0 (or every rank) on the launcher's terminal as it runs, as torchrun's
``--tee`` with ``--local-ranks-filter`` shows it.

The ranks write their output to ``rank.N/{stdout,stderr}`` themselves (torch elastic's redirects, or rank_start under
mpirun / srun), so the files keep everything whatever the terminal does: this only reads those files behind them, from
where it left off, at every tick of the supervision loop, and prints their complete lines through the rich console
(above the live progress bar; prefixed ``[rank N]`` with output.console=all). Bounded, so that a chatty rank never
holds up the supervision loop: a tick reads at most READ_BYTES and prints at most TICK_LINES lines of a file (a rank
that writes faster is shown later); a line over LINE_BYTES is cut with a marker and the rest of it, up to its newline,
is not shown; a carriage return keeps what a terminal would show, the text after it (a tqdm bar appears once, when
it ends); once the ranks ended, at most DRAIN_LINES more lines of each file are printed and the rest is named.
stdout and stderr lines of one rank are interleaved by tick, not exactly as written.

Only script= runs stream: a recipe's ranks report through the progress view (their metrics.jsonl) and the failure
report; their output (library warnings, the lost-peer errors the blame sorts out) stays in ``rank.N/``."""

from __future__ import annotations

from pathlib import Path

from rich.ansi import AnsiDecoder
from rich.console import Console
from rich.text import Text

from launcher.rundir import RunDir

__all__ = ["RankTee", "streamed_ranks"]

LINE_BYTES = 4096
"""A longer line is cut on the terminal (it is whole in the rank's file)."""
READ_BYTES = 256 * 1024
"""Of each file per tick (20 ticks a second)."""
TICK_LINES = 200
"""Of each file per tick: printing a line through rich costs some 25 us."""
DRAIN_LINES, DRAIN_BYTES = 5000, 4 * 2**20
"""Of each file once the ranks ended; what is left after either is named, not printed."""


def streamed_ranks(kind: str, mode: str, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Which of this host's ranks output.console=mode streams, for a run of this kind (script|recipe)."""
    if kind != "script" or mode == "none":
        return ()
    return tuple(r for r in ranks if mode == "all" or r == 0)


class _Stream:
    """One rank's stdout or stderr file, read on from where the last read ended, split into shown lines."""

    def __init__(self, path: Path, name: str, prefix: str) -> None:
        self.path, self.name, self._prefix = path, name, prefix
        self.offset = 0
        self._partial = b""
        self._skipping = False  # after a cut: the rest of that line, up to its newline, is not shown
        self._decoder = AnsiDecoder()  # colours carry from line to line, as on a terminal

    def read(self, budget: int = READ_BYTES, max_lines: int = TICK_LINES) -> list[Text]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(budget)
        except OSError:  # not created yet
            return []
        data, start = self._partial + chunk, self.offset - len(self._partial)  # data[0]'s place in the file
        *complete, rest = data.split(b"\n")
        if len(complete) > max_lines:  # the lines after these are read again next time
            complete, rest = complete[:max_lines], b""
            self.offset = start + sum(len(line) + 1 for line in complete)
        else:
            self.offset = start + len(data)
        lines = []
        for line in complete:
            if self._skipping:
                self._skipping = False
                continue
            lines.append(self._shown(line))
        self._partial = b"" if self._skipping else rest
        if len(self._partial) > LINE_BYTES:
            self._partial = _after_return(self._partial)
            if len(self._partial) > LINE_BYTES:
                lines.append(self._shown(self._partial))
                self._partial, self._skipping = b"", True
        return lines

    def rest(self) -> list[Text]:
        """A last line without a newline, once the rank ended."""
        line, self._partial = self._partial, b""
        return [self._shown(line)] if line and not self._skipping else []

    def _shown(self, line: bytes) -> Text:
        line = _after_return(line.rstrip(b"\r"))
        cut = len(line) > LINE_BYTES
        text = self._decoder.decode_line(line[:LINE_BYTES].decode("utf-8", errors="replace"))
        if cut:
            text.append(f" ... [line cut at {LINE_BYTES} bytes: all of it is in {self.name}]", style="dim")
        return Text(self._prefix, style="dim") + text if self._prefix else text


def _after_return(line: bytes) -> bytes:
    """What a terminal shows of a line with carriage returns: the text after the last one."""
    return line[line.rfind(b"\r") + 1 :]


class RankTee:
    """The streamed ranks' stdout and stderr files of one attempt; ``tick()`` while they run, ``drain()`` after."""

    def __init__(self, console: Console, run_dir: RunDir, ranks: tuple[int, ...], prefixed: bool) -> None:
        self._console = console
        self._streams = []
        for rank in ranks:
            rank_dir = run_dir.rank(rank)
            prefix = f"[rank {rank}] " if prefixed else ""
            for path in (rank_dir.stdout, rank_dir.stderr):
                self._streams.append(_Stream(path, f"{rank_dir.path.name}/{path.name}", prefix))

    def tick(self) -> None:
        self._print([line for s in self._streams for line in s.read()])

    def drain(self) -> None:
        """The rest of each file (up to DRAIN_LINES or DRAIN_BYTES, then where the rest is) and a last line without
        a newline."""
        for s in self._streams:
            start, shown = s.offset, 0
            while shown < DRAIN_LINES and s.offset - start < DRAIN_BYTES:
                before = s.offset
                lines = s.read(min(READ_BYTES, DRAIN_BYTES - (s.offset - start)), DRAIN_LINES - shown)
                self._print(lines)
                shown += len(lines)
                if s.offset == before:
                    break
            self._print(s.rest())
            try:
                left = s.path.stat().st_size - s.offset
            except OSError:
                left = 0
            if left > 0:
                self._print([Text(f"... {left} more bytes of {s.name} not shown: all of it is in {s.path}",
                                  style="dim")])

    def _print(self, lines: list[Text]) -> None:
        if lines:
            self._console.print(Text("\n").join(lines), soft_wrap=True, highlight=False)
