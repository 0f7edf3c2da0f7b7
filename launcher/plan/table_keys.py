"""The per-table keys of a recipe beside where a table lives: how its raw ids become rows (``tables.<name>.hash``,
``.hash_fn``) and the other names a table answers to in ``placement.tables`` / ``tables`` (a TorchRec table's own
name, beside its module path). Pure: no torch."""

from __future__ import annotations

from typing import Any

from launcher.plan.registry import HASH_FUNCTIONS, unknown
from launcher.schema import TableConfig


def hash_problems(name: str, rows: int, t: TableConfig, optimizer: str) -> list[str]:
    """What is wrong with table ``name``'s id hashing (tables.<name>.hash, .hash_fn)."""
    key = f"tables.{name}"
    if t.hash_fn not in HASH_FUNCTIONS:
        return [unknown(f"{key}.hash_fn", t.hash_fn, HASH_FUNCTIONS)]
    if isinstance(t.hash, bool) or not isinstance(t.hash, int) or t.hash < 0:
        return [f"{key}.hash={t.hash!r} must be 0 (ids are rows) or a number of rows to hash raw ids into (e.g. "
                f"{key}.hash={rows})."]
    if t.hash == 0:
        return [] if t.hash_fn == "mix" else [
            f"{key}.hash_fn={t.hash_fn} has no effect without {key}.hash: ids are rows. Set {key}.hash={rows} to hash "
            f"raw ids into the table's {rows:,} rows, or remove {key}.hash_fn."]
    if t.hash > rows:
        return [f"{key}.hash={t.hash:,}: the table has {rows:,} rows; raw ids can be hashed into at most that many. Set "
                f"{key}.hash={rows} (or enlarge the table in the model)."]
    if t.hash < 2:
        return [f"{key}.hash={t.hash} would send every id to one row. Set {key}.hash={rows} (the table's rows)."]
    if optimizer == "dense":
        return [f"{key}.hash={t.hash} with {key}.optimizer=dense: ids are hashed inside the table store's lookup, and "
                f"a dense table is the model's own nn.Embedding inside the parts, which takes row ids. Set "
                f"{key}.optimizer=lazy_adam (or ftrl), or remove {key}.hash."]
    return []


def resolve_aliases(section: str, entries: dict[str, Any], aliases: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """``entries`` (placement.tables or tables) with each key that is a table's other name (a TorchRec table name:
    ``t_user``) turned into its module path; problems when both names of one table are given."""
    out: dict[str, Any] = {}
    problems = []
    for key, value in entries.items():
        path = aliases.get(key, key)
        if path in out:
            problems.append(f"{section}.{key} and {section}.{path} name the same table: keep one of them.")
        out[path] = value
    return out, problems
