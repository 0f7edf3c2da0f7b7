"""to_plain and missing_keys: OmegaConf.to_container's and OmegaConf.missing_keys' results and errors, at a tenth of
their cost."""

import enum
from dataclasses import dataclass, field

import pytest
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import InterpolationKeyError, MissingMandatoryValue

from launcher.config import compose_config
from launcher.plain import missing_keys, to_plain
from tests.conftest import ALL_RECIPES


class Color(enum.Enum):
    RED = 1


@dataclass
class Inner:
    x: float = 1.5
    tags: list = field(default_factory=lambda: ["a", "b"])


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None
    color: Color = Color.RED
    need: int = MISSING


def _same(cfg, **kw):
    assert to_plain(cfg, **kw) == OmegaConf.to_container(cfg, **kw)
    assert type(to_plain(cfg, **kw)) is type(OmegaConf.to_container(cfg, **kw))


@pytest.mark.parametrize("recipe", ALL_RECIPES)
@pytest.mark.parametrize("resolve", [True, False])
def test_every_recipe_converts_as_omegaconf_does(recipe, resolve):
    cfg = compose_config([f"recipe={recipe}", "+tables={t.0: {optimizer: ftrl}}"])
    _same(cfg, resolve=resolve)
    _same(cfg.tables, resolve=resolve)


@pytest.mark.parametrize("resolve", [True, False])
def test_interpolations_missing_none_lists_enums_structured(resolve):
    cfg = OmegaConf.create({
        "a": 3, "b": "${a}", "deep": {"list": [1, {"c": "${a}"}, [2.5, None]], "plain": {"d": True}},
        "whole": "${deep.plain}", "esc": "\\${a}", "missing": "???", "none": None, "s": OmegaConf.structured(Outer),
        "items": ["x", "${a}"], "e": Color.RED,
    })
    _same(cfg, resolve=resolve)
    _same(cfg.deep, resolve=resolve)
    out = to_plain(cfg, resolve=resolve)
    assert out["s"]["maybe"] is None and out["s"]["color"] is Color.RED and out["missing"] == "???"
    assert out["b"] == (3 if resolve else "${a}") and out["esc"] == ("${a}" if resolve else "\\${a}")


def test_missing_and_broken_interpolations_raise_as_omegaconf_does():
    cfg = OmegaConf.create({"ok": {"a": 1}, "sec": {"need": "???", "other": [1, 2]}})
    with pytest.raises(MissingMandatoryValue) as ours:
        to_plain(cfg, throw_on_missing=True)
    with pytest.raises(MissingMandatoryValue) as theirs:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert str(ours.value) == str(theirs.value) and ours.value.full_key == "sec.need"
    broken = OmegaConf.create({"sec": {"x": "${nope}"}})
    with pytest.raises(InterpolationKeyError) as ours:
        to_plain(broken)
    with pytest.raises(InterpolationKeyError) as theirs:
        OmegaConf.to_container(broken, resolve=True)
    assert str(ours.value) == str(theirs.value)


def _outcome(f, cfg):
    try:
        return "ok", f(cfg)
    except Exception as e:  # noqa: BLE001 - the two must fail alike
        return type(e).__name__, str(e)


@pytest.mark.parametrize("tree", [
    {"a": "???", "b": {"c": "???", "d": [1, "???", {"e": "???"}]}, "f": "${b}", "h": None, "s": Outer},
    {"x": "${y}", "y": {"z": "???"}, "l": "???", "g": "${y.z}"},  # an interpolation to a missing value raises
    {"x": "${nope}", "m": "???"},
    {"x": 1, "y": {"z": [1, 2.5, "text"]}},
])
def test_missing_keys_as_omegaconf_finds_them(tree):
    cfg = OmegaConf.create({k: OmegaConf.structured(v) if isinstance(v, type) else v for k, v in tree.items()})
    assert _outcome(missing_keys, cfg) == _outcome(OmegaConf.missing_keys, cfg)


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_missing_keys_of_every_recipe(recipe):
    cfg = compose_config([f"recipe={recipe}"])
    assert missing_keys(cfg) == OmegaConf.missing_keys(cfg)
    script = compose_config(["script=train.py"])
    assert missing_keys(script) == OmegaConf.missing_keys(script) != set()
