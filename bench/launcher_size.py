"""launcher/'s size, and what chosen commits added to it: raw lines and code lines, per commit.

    .venv/bin/python bench/launcher_size.py REV [REV ...]           # launcher/'s size at each revision
    .venv/bin/python bench/launcher_size.py --commits C [C ...]     # each commit's change to launcher/, and the sum

A code line is a line of a .py file under launcher/ that holds a token of code: blank lines, comment lines and
docstrings (the first string of a module, class or function) do not count, so reflowing a docstring or a comment
changes the raw count but not the code count. A commit's change is against its first parent, so a merge counts the
whole branch it brings in; files are compared by path (renames as a removal and an addition). Not a test.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize

SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
DEFS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_lines(src: str) -> int:
    """The lines holding code: no blank, comment-only or docstring line."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        first = node.body[0] if isinstance(node, DEFS) and node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            docs.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in SKIP:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(lines)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def sizes(rev: str, paths: list[str]) -> tuple[int, int]:
    """(code, raw) lines of these .py files at rev; a file missing there counts 0."""
    code = raw = 0
    for path in paths:
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            code, raw = code + code_lines(shown.stdout), raw + shown.stdout.count("\n")
    return code, raw


def change(commit: str) -> tuple[int, int]:
    """What commit changed in launcher/'s (code, raw) lines against its first parent."""
    paths = [p for p in git("diff", "--name-only", "--no-renames", f"{commit}^1", commit, "--", "launcher").split()
             if p.endswith(".py")]
    (c0, r0), (c1, r1) = sizes(f"{commit}^1", paths), sizes(commit, paths)
    return c1 - c0, r1 - r0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="*")
    ap.add_argument("--commits", nargs="*", default=[])
    args = ap.parse_args()
    for rev in args.revs:
        paths = [p for p in git("ls-tree", "-r", "--name-only", rev, "launcher").split() if p.endswith(".py")]
        code, raw = sizes(rev, paths)
        print(f"{rev}: {code} code lines, {raw} lines, {len(paths)} modules")
    total_code = total_raw = 0
    for commit in args.commits:
        code, raw = change(commit)
        total_code, total_raw = total_code + code, total_raw + raw
        print(f"{commit} {code:+6d} code {raw:+6d} raw  {git('log', '-1', '--format=%s', commit).strip()[:90]}")
    if args.commits:
        print(f"sum of {len(args.commits)} commits: {total_code:+d} code lines, {total_raw:+d} lines")


if __name__ == "__main__":
    main()
