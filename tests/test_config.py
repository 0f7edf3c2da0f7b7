"""Composition: every shipped recipe composes; bad keys, values and recipes are reported all at once."""

import pytest
from omegaconf import OmegaConf

from launcher.config import compose_config
from launcher.errors import ConfigError
from tests.conftest import ALL_RECIPES


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_every_recipe_composes_and_resolves(recipe):
    cfg = compose_config([f"recipe={recipe}"])
    assert cfg.recipe.name == recipe
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert resolved["model"]["_target_"].startswith(f"launcher.recipes.{recipe}.")


def test_override_reaches_linked_keys():
    cfg = compose_config(["recipe=wide_deep", "model.rows_per_table=123"])
    assert cfg.data.rows_per_table == 123


def test_unknown_key_names_the_key_and_did_you_mean():
    with pytest.raises(ConfigError, match=r"trainer\.stepz: no such key \(value 3\)\. Did you mean trainer\.steps\?"):
        compose_config(["recipe=wide_deep", "trainer.stepz=3"])


def test_bad_type_names_key_and_current_value():
    with pytest.raises(ConfigError, match=r"trainer\.steps=many: .*Integer.*Current value: trainer\.steps=300"):
        compose_config(["recipe=wide_deep", "trainer.steps=many"])


def test_every_problem_reported_at_once():
    with pytest.raises(ConfigError) as e:
        compose_config(["recipe=quickstart", "trainer.stepz=3", "batch.micro=4", "model.hiden=8", "zero.stage=two"])
    assert len(e.value.problems) == 4
    text = str(e.value)
    for hint in ("trainer.steps", "batch.micro_size", "model.hidden", "zero.stage=two"):
        assert hint in text


def test_unknown_recipe_lists_available():
    with pytest.raises(ConfigError, match=r"recipe=wide_dep: no such recipe\. Did you mean recipe=wide_deep\? Available: gpt, quickstart, resnet, wide_deep"):
        compose_config(["recipe=wide_dep"])


def test_missing_recipe_says_how_to_pick_one():
    with pytest.raises(ConfigError, match=r"recipe is not set\. Pick one: recipe=gpt \| recipe=quickstart \| recipe=resnet \| recipe=wide_deep"):
        compose_config([])


def test_unparsable_override():
    with pytest.raises(ConfigError, match="could not parse the command line"):
        compose_config(["recipe=wide_deep", "trainer.steps=[1,"])
