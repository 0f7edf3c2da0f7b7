"""The one error users see for bad input: every problem at once, each naming key, value and fix."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence


class ConfigError(Exception):
    """Raised before anything is spawned. ``problems`` holds one sentence (or short paragraph) per problem."""

    about = "in the config; nothing was started."

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} {self.about}"
        return head + "".join(f"\n  - {p}" for p in self.problems)


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "", cutoff: float = 0.6) -> str:
    """' Did you mean <prefix><the closest candidate>?', or '' when none is close enough."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return f" Did you mean {prefix}{close[0]}?" if close else ""


def few(names: Sequence[str], shown: int = 4) -> str:
    """The first ``shown`` names, then how many more there are: 'a, b, c, d and 3 more'."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, without its final period (to quote inside a problem sentence)."""
    text = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if len(text) > 1 and text[0].endswith(":"):  # Hydra's "... raised while composing config:" then the cause
        return f"{text[0]} {text[1]}".rstrip(".")
    return text[0].rstrip(".") if text else type(e).__name__


def first_words(e: BaseException) -> str:
    """``Type: first line`` of an exception (first_line with the exception's type in front)."""
    return f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 control characters but newline and tab, DEL, C1 control characters, and the bidirectional overrides and
isolates (which reorder the text shown around them)."""


def printable(text: str) -> str:
    """``text`` safe to print on a terminal or write to XML: every control character other than newline and tab
    (ESC included, so an escape sequence shows as text instead of moving the cursor or colouring) as a visible
    ``\\xNN`` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text)
