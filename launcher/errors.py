"""The one error users see for bad input: every problem at once, each naming key, value and fix."""

from __future__ import annotations


class ConfigError(Exception):
    """Raised before anything is spawned. ``problems`` holds one sentence (or short paragraph) per problem."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the config; nothing was started."
        return head + "".join(f"\n  - {p}" for p in self.problems)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, without its final period (to quote inside a problem sentence)."""
    text = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if len(text) > 1 and text[0].endswith(":"):  # Hydra's "... raised while composing config:" then the cause
        return f"{text[0]} {text[1]}".rstrip(".")
    return text[0].rstrip(".") if text else type(e).__name__
