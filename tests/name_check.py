"""The check behind "no code outside a registry's package compares its names as strings" (the parallel parts,
the launch backends): every comparison of a registered name as a string literal in a module's source."""

from __future__ import annotations

import ast


def _strings(node: ast.AST) -> set[str]:
    """String constants in an expression, also inside tuples, lists and sets."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every comparison (==, !=, in, match case) of one of ``names`` as a string literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hits = set().union(*(_strings(n) for n in (node.left, *node.comparators))) & names
            found += [(node.lineno, h) for h in sorted(hits)]
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            found += [(node.pattern.lineno, h) for h in sorted(_strings(node.pattern.value) & names)]
    return found
