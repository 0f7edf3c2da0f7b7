"""Modules of the launcher and its recipes stay at 400 lines at most (the style guide's 50-400): a module that grows
past it is split where its parts are separate concerns."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 400


def test_no_module_is_longer_than_400_lines():
    long = {str(p.relative_to(ROOT)): n for folder in ("launcher", "recipes") for p in (ROOT / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LIMIT}
    assert not long, f"modules over {LIMIT} lines (split them): {long}"
