"""The recipe contract is checked when a recipe registers, and every shipped recipe follows it."""

import subprocess
import sys

import pytest

from launcher.contract import DataFacts, Recipe, check_recipe, register
from launcher.recipes import RECIPES
from launcher.recipes.quickstart import Quickstart


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_shipped_recipes_follow_the_contract(name):
    recipe = RECIPES[name]
    assert isinstance(recipe, Recipe) and recipe.name == name
    check_recipe(recipe)


def test_a_missing_hook_and_a_misspelt_argument_are_named():
    class Broken(Quickstart):  # a test double of a user's recipe, not a shipped one
        name = "broken"
        layers = None

        def problems(self, model, data, micro_size):
            return []

    with pytest.raises(TypeError, match=r"recipe broken does not follow launcher.contract.Recipe: problems\(model, "
                                        r"data, micro_size\) should take \(model, data, micro_group\); no hook layers"):
        check_recipe(Broken())


def test_data_option_names_are_unique_across_recipes():
    class Twin(Quickstart):
        name = "twin"

    with pytest.raises(TypeError, match="data option quickstart of recipe twin is also recipe quickstart's"):
        register(Quickstart(), Twin())


def test_layers_name_the_blocks_in_order():
    from hydra.utils import instantiate

    from launcher.config import compose_config

    cfg = compose_config(["recipe=gpt", "model.layers=3"])
    model = instantiate(cfg.model)
    names = [n for n, _ in RECIPES["gpt"].layers(model)]
    assert names == ["embedding", "block.0", "block.1", "block.2", "head"]
    assert [n for n, _ in RECIPES["quickstart"].layers(instantiate(compose_config(["recipe=quickstart"]).model))] == [
        "fc1", "relu", "fc2"]


def test_data_facts_go_into_the_plan_and_leave_the_config_alone(tmp_path, cpu_host):
    from launcher.config import compose_config
    from launcher.facts.preflight import gather_facts
    from launcher.plan import plan_launch
    from tests.data.make_ctr_csv import write_ctr_csv

    write_ctr_csv(str(tmp_path / "ctr.csv"), 400)
    cfg = compose_config(["recipe=wide_deep", "data=tabular", f"data.path={tmp_path / 'ctr.csv'}",
                          "data.label=clicked", "data.positive=yes", "data.drop=[user_id]", "batch.global_size=64"])
    before = str(cfg)
    facts = gather_facts(cfg).data
    plan = plan_launch(cfg, cpu_host, gather_facts(cfg))
    assert str(cfg) == before  # the composed config is never mutated
    assert plan.model["field_sizes"] == facts.model_sizes["field_sizes"] and cfg.model.field_sizes == []
    assert plan.model["num_sparse"] == len(facts.model_sizes["field_sizes"])
    assert facts.train_samples == 320 and plan.steps == 5 * (320 // 64)  # data=tabular trains 5 epochs


def test_gpt_reference_numbers():
    import math

    facts = RECIPES["gpt"].data_facts(RECIPES["gpt"].data_configs["markov"](vocab_size=64, seq_len=64))
    assert facts.reference["uniform_loss"] == pytest.approx(math.log(64), abs=1e-6)
    assert 0 < facts.reference["entropy_floor"] < facts.reference["uniform_loss"]
    assert facts.train_samples is None and isinstance(facts, DataFacts)


def test_resident_bytes_of_the_built_in_data():
    """A data set a rank holds whole counts its tensors' bytes (quickstart's train and held-out copies); a stream
    generated batch by batch holds none (gpt, resnet, wide_deep's synthetic_ctr)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from launcher.config import compose_config

    cfg = compose_config(["recipe=quickstart", "data.samples=48", "data.in_features=5", "model.in_features=5"])
    facts = RECIPES["quickstart"].data_facts(OmegaConf.to_object(cfg.data))
    source = instantiate(cfg.data)
    held = (source.inputs, source.labels, source.eval_inputs, source.eval_labels)
    assert facts.resident_bytes == sum(t.nbytes for t in held) == 2 * 48 * (5 + 16) * 4
    for name in ("gpt", "resnet", "wide_deep"):
        data = OmegaConf.to_object(compose_config([f"recipe={name}"]).data)
        assert RECIPES[name].data_facts(data).resident_bytes == 0, name


def test_a_data_file_smaller_than_a_global_micro_batch_is_refused(tmp_path, cpu_host):
    from launcher.config import compose_config
    from launcher.errors import ConfigError
    from launcher.facts.preflight import gather_facts
    from launcher.plan import plan_launch
    from tests.data.make_ctr_csv import write_ctr_csv

    write_ctr_csv(str(tmp_path / "ctr.csv"), 100)
    cfg = compose_config(["recipe=wide_deep", "data=tabular", f"data.path={tmp_path / 'ctr.csv'}",
                          "data.label=clicked", "data.positive=yes", "trainer.epochs=0", "trainer.steps=5"])
    with pytest.raises(ConfigError, match=r"the data has 80 training samples, fewer than one global micro-batch "
                                          r"\(batch.micro_size 256 × dp 2 = 512\)\. Lower batch.global_size"):
        plan_launch(cfg, cpu_host, gather_facts(cfg))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_layer_names_are_the_names_of_layers(name):
    """The torch-free names the plan checks recompute against are those of the built model's layers()."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from launcher.config import compose_config

    recipe = RECIPES[name]
    cfg = compose_config([f"recipe={name}", "smoke=true"])
    spec = recipe.model_spec(OmegaConf.to_object(cfg.model), DataFacts())
    assert recipe.layer_names(spec) == [n for n, _ in recipe.layers(instantiate(spec))]


def test_a_built_in_recipe_is_traced_only_where_the_plan_needs_it():
    """gather_facts of a plain built-in run imports no torch (fast dry runs); placement.mode=auto, like recompute,
    gets the per-layer activation trace the planner chooses the recompute set and predicts memory with."""
    code = (
        "import sys\n"
        "from launcher.config import compose_config\n"
        "from launcher.facts.preflight import gather_facts\n"
        "for r in ('gpt', 'quickstart', 'wide_deep'):  # resnet recomputes and has 2 stages by default\n"
        "    assert gather_facts(compose_config([f'recipe={r}'])).activations is None, r\n"
        "assert 'torch' not in sys.modules\n"
        "for r in ('gpt', 'wide_deep'):\n"
        "    facts = gather_facts(compose_config([f'recipe={r}', 'placement.mode=auto']))\n"
        "    assert facts.activations and sum(v['saved'] for v in facts.activations.values()) > 0, r\n"
        "    assert gather_facts(compose_config([f'recipe={r}', 'placement.mode=auto']), estimate=False).activations "
        "is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
