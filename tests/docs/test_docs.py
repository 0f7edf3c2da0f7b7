"""The manual stays true to the code: the configuration reference is regenerated from the schema (stale = fail,
with the command that fixes it), names every key the schema has, and every relative link in README.md and
docs/*.md reaches a file (and a heading, for #anchors). Pure text and OmegaConf: no Hydra compose, no torch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from launcher.report import config_reference

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_reference_is_what_the_schema_generates():
    on_disk = config_reference.PAGE.read_text() if config_reference.PAGE.exists() else ""
    assert on_disk == config_reference.render(), (
        f"docs/configuration.md is stale (the schema changed): run {config_reference.COMMAND} and commit it")


def _keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of a structured config, read by OmegaConf (not by the generator): a dict typed with a
    dataclass value (``tables``) contributes its value's keys under ``<name>``."""
    keys = []
    for name in node.keys():
        child = node._get_node(name)
        path = f"{prefix}{name}"
        keys.append(path)
        if isinstance(child, DictConfig):
            element = child._metadata.element_type
            if child._metadata.object_type not in (None, dict):
                keys += _keys(child, f"{path}.")
            elif isinstance(element, type) and hasattr(element, "__dataclass_fields__"):
                keys += _keys(OmegaConf.structured(element), f"{path}.<name>.")
    return keys


def _section(text: str, heading: str) -> str:
    """The text under the first ``### `` heading that starts with ``heading``, up to the next heading."""
    start = text.index(f"\n### {heading}")
    end = text.find("\n#", start + 1)
    return text[start:end if end > 0 else None]


def test_every_schema_key_is_in_the_reference():
    from launcher.recipes import RECIPES
    from launcher.schema import HeteroConfig

    text = config_reference.PAGE.read_text()
    root = _keys(OmegaConf.structured(HeteroConfig))
    assert len(root) > 100 and "tables.<name>.lr" in root and "cluster.nnodes" in root, root  # the walk itself
    missing = [k for k in root if f"| `{k}` |" not in text and f"\n## `{k}`\n" not in text]  # a row, or a section
    for name, recipe in RECIPES.items():
        section = _section(text, f"recipe={name}: `model`")
        missing += [f"{name}: {k}" for k in _keys(OmegaConf.structured(recipe.model_config), "model.")
                    if f"| `{k}` |" not in section]
        for option, node in recipe.data_configs.items():
            section = _section(text, f"recipe={name}, data={option}: `data`")
            missing += [f"{name}/{option}: {k}" for k in _keys(OmegaConf.structured(node), "data.")
                        if f"| `{k}` |" not in section]
    assert not missing, f"keys missing from docs/configuration.md (run {config_reference.COMMAND}): {missing}"


def test_a_key_without_a_docstring_shows_empty_and_odd_text_is_escaped():
    row = config_reference._table([config_reference.Key("a.b", "str", "x", "one | two <run> `x|y` a_b")])[2]
    assert row == "| `a.b` | `str` | `x` | one \\| two \\<run> `x\\|y` a\\_b |"


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-', repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", text).splitlines():
        if line.startswith("#"):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchors_follow_githubs_rule():
    assert anchors("# A `b` c?\n## Two: three\n## Two: three\n```\n# not a heading\n```") == {
        "a-b-c", "two-three", "two-three-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail to a page under docs/"
