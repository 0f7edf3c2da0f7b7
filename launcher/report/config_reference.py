"""docs/configuration.md, generated from the schema: every key a user can type, with its type, default and docstring.

The schema's dataclasses (``launcher/schema.py``, and each built-in recipe's ``model`` / ``data`` schemas, all stored
in Hydra's ConfigStore) document each field with a string right under it. Python drops those attribute docstrings
at runtime, so they are read from the classes' source with ``ast``. A hand-kept reference goes stale the day a key
is added; this one is regenerated instead, and ``tests/docs/test_docs.py`` fails while the page on disk differs:

    .venv/bin/python -m launcher.report.config_reference          # rewrite docs/configuration.md
    .venv/bin/python -m launcher.report.config_reference --check  # exit 1 if it is stale
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

COMMAND = ".venv/bin/python -m launcher.report.config_reference"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_MISSING = "???"  # omegaconf.MISSING: a required value


@dataclasses.dataclass(frozen=True)
class Key:
    """One row of the reference: a dotted key (``tables.<name>.lr``), its type as written, default and docstring."""

    path: str
    type: str
    default: str
    doc: str


def attribute_docs(cls: type) -> dict[str, tuple[str, str]]:
    """Each annotated field of ``cls``'s body -> (its annotation as written, the docstring under it or "")."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    found = {}
    for stmt, after in zip(body, [*body[1:], None]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            doc = ""
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                doc = inspect.cleandoc(after.value.value)
            found[stmt.target.id] = (ast.unparse(stmt.annotation), doc)
    return found


def schema_keys(cls: type, prefix: str = "") -> list[Key]:
    """Every key under ``cls``, depth first in field order: a nested dataclass is a section whose own row comes
    before its keys; a ``dict[str, <dataclass>]`` (``tables``) is a section keyed by ``<name>``."""
    hints = typing.get_type_hints(cls)
    written = attribute_docs(cls)
    keys = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        annotation, doc = written.get(f.name, (str(hints[f.name]), ""))
        hint = hints[f.name]
        nested = _dataclass_of(hint)
        if nested is not None:
            keys.append(Key(path, annotation, "", doc or _class_doc(nested)))
            keys.extend(schema_keys(nested, f"{path}."))
            continue
        value = _dict_value_dataclass(hint)
        if value is not None:
            keys.append(Key(path, annotation, _show(_default(f)), doc or _class_doc(value)))
            keys.extend(schema_keys(value, f"{path}.<name>."))
            continue
        if f.name == "_target_" and not doc:
            doc = "The class (or function) these keys are the arguments of, by dotted import path."
        keys.append(Key(path, annotation, _show(_default(f)), doc))
    return keys


def _dataclass_of(hint: Any) -> type | None:
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _dict_value_dataclass(hint: Any) -> type | None:
    if typing.get_origin(hint) is dict:
        args = typing.get_args(hint)
        return _dataclass_of(args[1]) if len(args) == 2 else None
    return None


def _class_doc(cls: type) -> str:
    doc = cls.__doc__ or ""
    return "" if doc.startswith(f"{cls.__name__}(") else inspect.cleandoc(doc)  # dataclass's generated signature


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _MISSING


def _show(value: Any) -> str:
    """A default as one would type it on the command line (YAML's spelling: true, null, [a, b])."""
    if value == _MISSING:
        return "required"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, ``rst`` literals as code, Markdown's specials escaped outside code."""
    text = " ".join(text.split()).replace("``", "`")
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unbalanced backtick: no code spans at all
        parts = [text.replace("`", "\\`")]
    for i in range(0, len(parts), 2):
        for char in "\\*_<[]":  # > starts nothing inside a cell
            parts[i] = parts[i].replace(char, "\\" + char)
    return "`".join(parts).replace("|", "\\|")


def _table(keys: list[Key]) -> list[str]:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for k in keys:
        default = f"`{k.default}`" if k.default else ""
        lines.append(f"| `{k.path}` | `{k.type}` | {default} | {_cell(k.doc)} |")
    return lines


def _sections(keys: list[Key]) -> dict[str, list[Key]]:
    """Keys grouped by their top-level section; top-level scalars together under ""."""
    sections: dict[str, list[Key]] = {"": []}
    heads = {k.path for k in keys if any(o.path.startswith(f"{k.path}.") for o in keys)}
    for k in keys:
        top = k.path.split(".")[0]
        sections.setdefault(top if top in heads else "", []).append(k)
    return sections


def render() -> str:
    """The whole page, deterministic (field order of the schema; recipes and data options in registry order)."""
    from launcher.recipes import RECIPES
    from launcher.schema import HeteroConfig

    out = ["# Configuration reference", "",
           f"Generated from the schema's docstrings by `{COMMAND}`: do not edit by hand (`tests/docs/test_docs.py` "
           "fails while this page differs from what the command writes). Every key is typed, and an unknown one is "
           "an error with a did-you-mean. Set a key on the command line (`trainer.steps=500`), in a recipe's YAML, or "
           "add one to a dict with `+` (`+placement.tables.user_emb=host`). Sentinels: `-1` means infer it where a "
           "key says so; `auto` means decide from the host or the model. The topic pages "
           "(listed in the [README](../README.md)) explain what the keys do together.", ""]
    sections = _sections(schema_keys(HeteroConfig))
    out += ["## Top-level keys", "", *_table(sections.pop("")), ""]
    for name, keys in sections.items():
        head, rest = keys[0], keys[1:]
        out += [f"## `{name}`", ""]
        if head.doc:
            out += [_cell(head.doc), ""]
        out += [*_table(rest), ""]
    out += ["## Recipe schemas", "",
            "Each built-in recipe types its own `model` keys and, per `data=` option, its `data` keys (stored in "
            "Hydra's ConfigStore as `schema/model/<recipe>` and `schema/data/<option>`). A recipe in your own folder "
            "has no such schema: its `model`, `data`, `eval_data` and `loss` keys are its constructors' arguments, "
            "checked against their signatures before launch. A built-in recipe's `model._target_` (or "
            "`data._target_`) may name your own class that the recipe can use in place of its own (`recipe=wide_deep "
            "model._target_=my_pkg.MyWideDeep`, a subclass of the recipe's): before launch it is imported, its "
            "constructor must take the recipe's arguments, a model built on the meta device must have the recipe's "
            "tables (name and shape) and layers, and a data class the methods the ranks call (`train_batches`, "
            "`eval_batches`); anything else stops with exit 2, not in the ranks.", ""]
    for name, recipe in RECIPES.items():
        out += [f"### recipe={name}: `model`", "", *_table(schema_keys(recipe.model_config, "model.")), ""]
        for option, node in recipe.data_configs.items():
            doc = _class_doc(node)
            out += [f"### recipe={name}, data={option}: `data`", ""]
            out += [_cell(doc), ""] if doc else []
            out += [*_table(schema_keys(node, "data.")), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
