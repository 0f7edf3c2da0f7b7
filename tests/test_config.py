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


@pytest.mark.parametrize("line, said", [
    ("parallel.tensor_parallel=2", "Here that is parallel.tp: write parallel.tp=2."),  # was: parallel.data_parallel=2
    ("parallel.tensor_paralel=2", "Here that is parallel.tp: write parallel.tp=2."),
    ("placement.offload_optimizer=true", "Here that is optimizer.target: write optimizer.target=CPU."),
    ("placement.offload_optimizer=false", "Here that is optimizer.target, off by default: leave it out."),
    ("trainer.max_steps=10", "Here that is trainer.steps: write trainer.steps=10."),
])
def test_another_tools_key_names_ours(line, said):
    """Megatron's, DeepSpeed's and HF Trainer's names for our keys: the spelling's did-you-mean had sent
    tensor_parallel to data_parallel and offload_optimizer to offload_params, each refused next."""
    with pytest.raises(ConfigError) as e:
        compose_config(["recipe=gpt", line])
    assert said in str(e.value), str(e.value)
    if "write " in said:
        compose_config(["recipe=gpt", said.split("write ")[1].rstrip(".")])  # the advice composes


@pytest.mark.parametrize("recipe, line", [
    ("mnist_mlp", "placement.modules={dense1: host}"), ("mnist_mlp", "placement.modules.dense1=host"),
    ("gpt", "parallel.stages={embedding: 0, head: 1}"), ("gpt", "parallel.stages.embedding=0"),
])
def test_a_mapping_of_names_without_its_plus_is_told_the_form_that_composes(recipe, line):
    """placement.modules and parallel.stages (names of your choosing): "set one key at a time" had led to "no such
    key" with no fix; Hydra adds to such a mapping only with a leading +, which the message says and which composes."""
    with pytest.raises(ConfigError) as e:
        compose_config([f"recipe={recipe}", line])
    assert f"Hydra adds a name to such a mapping only with a leading +: write '+{line}'." in str(e.value), str(e.value)
    compose_config([f"recipe={recipe}", f"+{line}"])


def test_a_name_the_mapping_has_is_set_without_a_plus():
    """resnet's YAML names its stages: setting or deleting one is a plain key (the + advice had looped there: + is
    refused for a key that is there), and a wrong type is named as such."""
    compose_config(["recipe=resnet", "parallel.stages.fc=0"])
    compose_config(["recipe=resnet", "~parallel.stages.fc"])
    with pytest.raises(ConfigError) as e:
        compose_config(["recipe=resnet", "parallel.stages.fc=x"])
    assert "could not be converted to Integer" in str(e.value) and "'+parallel" not in str(e.value), str(e.value)


@pytest.mark.parametrize("line, hint", [
    ("model.nan_at=5", None),  # the shared "model." is no likeness: not model.in_features, not model._target_
    ("model.hiden=5", "model.hidden"),
    ("trainr.steps=5", "trainer.steps"),  # a typo in the section's name
])
def test_did_you_mean_compares_the_key_not_its_section(line, hint):
    with pytest.raises(ConfigError) as e:
        compose_config(["recipe=quickstart", line])
    text = e.value.render()
    assert f"{line.split('=')[0]}: no such key (value 5)." in text
    assert (f"Did you mean {hint}? Write {hint}=5." in text) if hint else ("Did you mean" not in text
                                                                         and "Keys under model:" in text), text


def test_loss_keys_are_its_constructors_arguments():
    """loss is an open _target_ section: a key its file does not list is an argument, set with or without +."""
    for line in ("loss.reduction=sum", "loss={_target_: torch.nn.MSELoss, reduction: sum}"):
        assert compose_config(["recipe=quickstart", line]).loss == {"_target_": "torch.nn.MSELoss", "reduction": "sum"}


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
    with pytest.raises(ConfigError, match=r"recipe=wide_dep: no such recipe\. Did you mean recipe=wide_deep\? Available: gpt, mnist_mlp, quickstart, resnet, wide_deep"):
        compose_config(["recipe=wide_dep"])


def test_missing_recipe_says_how_to_pick_one():
    with pytest.raises(ConfigError, match=r"recipe is not set\. Pick one: recipe=gpt \| recipe=mnist_mlp \| recipe=quickstart \| recipe=resnet \| recipe=wide_deep"):
        compose_config([])


def test_unparsable_override():
    with pytest.raises(ConfigError, match="could not parse the command line"):
        compose_config(["recipe=wide_deep", "trainer.steps=[1,"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("++some.new_key=1", r"\+\+some.new_key=1: the root has no key some, so the value would be ignored"),
        ("+trainer.stepz=3", r"\+trainer.stepz=3: trainer has no key stepz, so the value would be ignored\. Did you "
                             r"mean trainer.steps\?"),
        ("+model.widht=3", r"\+model.widht=3: model has no key widht.*Did you mean model.width\?"),
        ("trainer.steps=${nope}", r"trainer.steps: Interpolation key 'nope' not found"),
    ],
)
def test_added_keys_and_broken_interpolations_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_config(["recipe=gpt", override])


def test_added_keys_in_open_sections_still_work():
    cfg = compose_config(["recipe=gpt", "++trainer.steps=3", "+parallel.stages.embedding=0"])
    assert cfg.trainer.steps == 3 and cfg.parallel.stages.embedding == 0


def test_steps_the_user_writes_win_over_a_data_option_s_epochs_and_both_written_are_refused():
    """data=tabular defaults to trainer.epochs=5: trainer.steps=30 on the command line trains 30 steps (issue 45)."""
    base = ["recipe=wide_deep", "data=tabular", "data.path=x.csv", "data.label=y", "data.positive=1"]
    assert compose_config(base).trainer.epochs == 5
    cfg = compose_config([*base, "trainer.steps=30"])
    assert cfg.trainer.steps == 30 and cfg.trainer.epochs == 0
    with pytest.raises(ConfigError) as e:
        compose_config([*base, "trainer.steps=30", "trainer.epochs=2"])
    assert "trainer.steps=30 and trainer.epochs=2 were both given" in str(e.value.render())


@pytest.mark.parametrize("override, hint", [
    ("hydra.run.dir=outs", "set output.log_dir=outs (and output.run_name=<name>"),
    ("hydra.sweep.dir=sweeps", "set output.log_dir=sweeps."),
    ("hydra/launcher=basic", "remove it."),
])
def test_hydra_s_own_run_settings_are_refused_with_what_to_set_instead(override, hint):
    with pytest.raises(ConfigError) as e:
        compose_config(["recipe=quickstart", override])
    said = str(e.value.render())
    assert f"{override}: Hydra's own run settings do nothing here" in said and hint in said, said


def test_a_value_hydra_s_grammar_cannot_read_gets_a_hint_to_quote_it():
    with pytest.raises(ConfigError) as e:
        compose_config(["recipe=wide_deep", "data=tabular", "data.positive=>50K"])
    assert ("A value with characters Hydra's grammar reserves is quoted: data.positive='>50K' (in a shell, "
            "\"data.positive='>50K'\").") in str(e.value.render())


@pytest.mark.parametrize("target, says", [
    ("launcher.recipes.wide_deep.model.Nope", "launcher.recipes.wide_deep.model defines no Nope"),
    ("nope.Nope", "importing it fails with ModuleNotFoundError: No module named 'nope'"),
    ("Nope", "'Nope' is no dotted path"),
    ("broken_hl.Net", "importing it fails with ModuleNotFoundError: No module named 'no_such_package_hl'"),  # inside it
])
def test_a_built_in_recipes_target_that_names_nothing_exits_2_before_any_rank(cli, tmp_path, target, says):
    (tmp_path / "broken_hl.py").write_text("import no_such_package_hl\nNet = None\n")  # its source defines Net
    res = cli(["recipe=wide_deep", "dry_run=true", f"model._target_={target}"], tmp_path)
    assert res.returncode == 2 and f"model._target_={target}: {says}" in res.stdout + res.stderr
    ok = cli(["recipe=wide_deep", "dry_run=true", "model._target_=launcher.recipes.wide_deep.model.WideDeep"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr


REPLACEMENTS = '''
from torch import nn
from launcher.recipes.wide_deep.data import SyntheticCTR
from launcher.recipes.wide_deep.model import WideDeep


class Sub(WideDeep):
    pass


class SmallTable(WideDeep):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.deep_embedding = nn.Embedding(10, 3)
        del self.wide_embedding


class Rows(SyntheticCTR):
    pass


class NoBatches:
    def __init__(self, **kw):
        pass
'''


@pytest.mark.parametrize("override, says", [
    ("model._target_=torch.nn.Linear", "model._target_=torch.nn.Linear does not take recipe wide_deep's model "
     "arguments (num_dense, num_sparse, rows_per_table, field_sizes, embed_dim, hidden): it has no argument num_dense, "
     "num_sparse, rows_per_table, field_sizes, embed_dim, hidden; it needs in_features, out_features, which the "
     "recipe does not give."),
    ("model._target_=launcher.recipes.gpt.model.GPT", "it needs vocab_size, seq_len, layers, width"),
    ("model._target_=replacements_hl.SmallTable", "model._target_=replacements_hl.SmallTable has a (10, 3) weight at "
     "deep_embedding, where recipe wide_deep places a (2600, 4) table"),
    ("model._target_=replacements_hl.SmallTable", "has no module with a weight at wide_embedding"),
    ("data._target_=replacements_hl.NoBatches",
     "data._target_=replacements_hl.NoBatches has no method train_batches, eval_batches"),
    ("data._target_=launcher.recipes.gpt.data.MarkovTokens", "it needs vocab_size, seq_len, candidates, skew"),
])
def test_a_built_in_recipes_replaced_target_that_does_not_fit_it_exits_2_before_any_rank(cli, tmp_path, override,
                                                                                          says):
    (tmp_path / "replacements_hl.py").write_text(REPLACEMENTS)
    res = cli(["recipe=wide_deep", "smoke=true", "dry_run=true", override], tmp_path)
    assert res.returncode == 2 and says in res.stdout + res.stderr, res.stdout + res.stderr


def test_a_subclass_of_a_built_in_recipes_model_or_data_is_taken(cli, tmp_path):
    (tmp_path / "replacements_hl.py").write_text(REPLACEMENTS)
    res = cli(["recipe=wide_deep", "smoke=true", "dry_run=true", "model._target_=replacements_hl.Sub",
               "data._target_=replacements_hl.Rows"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("recipe, option, says", [
    ("gpt", "tabular", "data=tabular: recipe gpt has no data tabular; its data: markov. Pick it, or leave data= out"),
    ("wide_deep", "markov", "data=markov: recipe wide_deep has no data markov; its data: synthetic_ctr, tabular. Pick "
     "one of them"),
    ("quickstart", "nope", "data=nope: recipe quickstart has no data nope; its data: quickstart."),
])
def test_data_a_recipe_does_not_have_is_named_with_the_recipes_own(cli, tmp_path, recipe, option, says):
    res = cli([f"recipe={recipe}", f"data={option}", "dry_run=true"], tmp_path)
    assert res.returncode == 2 and says in res.stdout + res.stderr, res.stdout + res.stderr


@pytest.mark.parametrize("recipe, option", [("gpt", "markov"), ("resnet", "images"), ("wide_deep", "synthetic_ctr")])
def test_a_recipes_own_data_option_as_the_configuration_reference_names_it_is_taken(cli, tmp_path, recipe, option):
    res = cli([f"recipe={recipe}", f"data={option}", "dry_run=true"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("lines, says", [
    (["recipe=null"], "recipe=null: recipe= picks one option by its name; recipe's options: gpt, mnist_mlp, quickstart, "
                      "resnet, wide_deep. Give one, e.g. recipe=gpt."),
    (["recipe=[gpt]"], "recipe=[gpt]: recipe= picks one option by its name"),
    (["recipe={a:1}"], "recipe={a:1}: recipe= picks one option by its name"),
    (["recipe=gpt", "parallel=null"], "parallel=null: parallel= picks one option by its name; parallel's options: "
                                      "semi_auto. Give one, e.g. parallel=semi_auto, or leave parallel= out."),
    (["recipe=gpt", "placement={a:1}"], "placement={a:1}: placement= picks one option by its name"),
    (["recipe=wide_deep", "data=[synthetic_ctr,tabular]"], "data's options: synthetic_ctr, tabular."),
    (["recipe=gpt", "data=null"], "data's options: markov."),
    (["recipe=1"], "recipe=1: recipe= picks one option by its name; recipe's options: "),  # Hydra: ValueError "Got int"
    (["recipe=gpt", "placement=1"], "placement=1: placement= picks one option by its name"),
    (["recipe=gpt", "parallel=true"], "parallel=true: parallel= picks one option by its name"),
    (["recipe=wide_deep", "data=2.5"], "data=2.5: data= picks one option by its name; data's options: synthetic_ctr"),
])
def test_a_config_group_given_anything_but_a_name_exits_2_naming_its_options(cli, tmp_path, lines, says):
    res = cli([*lines, "dry_run=true"], tmp_path)  # Hydra raised ValueError / TypeError here
    assert res.returncode == 2 and says in res.stdout + res.stderr, res.stdout + res.stderr


def test_a_sweep_over_a_glob_exits_2_with_the_forms_a_sweep_takes(cli, tmp_path):
    res = cli(["-m", "recipe=glob(*)", "dry_run=true"], tmp_path)  # Hydra raised "ConfigLoader is not set"
    assert res.returncode == 2 and "could not expand the sweep: recipe=glob(*). A sweep takes key=a,b" in res.stderr


def test_a_sweep_whose_jobs_share_a_checkpoint_dir_exits_2_before_any_job(cli, tmp_path):
    """Job 1 would write over job 0's checkpoints (refused at its launch, after job 0 trained); a folder per job
    plans."""
    res = cli(["-m", "recipe=quickstart", "trainer.steps=3,4", f"trainer.checkpoint_dir={tmp_path / 'ck'}",
               "dry_run=true"], tmp_path)
    said = " ".join(res.stderr.split())
    assert res.returncode == 2 and f"trainer.checkpoint_dir={tmp_path / 'ck'} is job 0's too" in said, said
    assert not (tmp_path / "log_output").exists()
    res = cli(["-m", "recipe=quickstart", f"trainer.checkpoint_dir={tmp_path / 'a'},{tmp_path / 'b'}",
               "dry_run=true"], tmp_path)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("lines, says", [
    (["recipe=gpt", "~trainer"], "~trainer: trainer is a key of the config's schema, so it always has a value (a "
                                 "section) and cannot be removed."),  # the launcher raised ConfigAttributeError
    (["recipe=wide_deep", "~tables"], "~tables: tables is a key of the config's schema"),
    (["recipe=gpt", "~loss"], "~loss: loss is a key of the config's schema"),
    (["recipe=gpt", "~trainer.steps"], "~trainer.steps: trainer.steps is a key of the config's schema, so it always "
                                       "has a value (now 1000) and cannot be removed. Set trainer.steps=<value> to "
                                       "change it, or leave ~trainer.steps out."),  # Hydra: "Error merging override"
    (["recipe=gpt", "~model.width"], "~model.width: model.width is a key of the config's schema"),
    (["recipe=gpt", "~data"], "~data: data is a config group, left out by not choosing it."),
])
def test_removing_a_key_of_the_schema_exits_2_naming_it(cli, tmp_path, lines, says):
    res = cli([*lines, "dry_run=true"], tmp_path)
    assert res.returncode == 2 and says in res.stdout + res.stderr, res.stdout + res.stderr


@pytest.mark.parametrize("lines, says, fine", [
    # composed, then failed on an interpolation into it: "node `model` is not a container"
    (["recipe=wide_deep", "model=foo"], "model=foo: model is a section of keys, not a single value; its keys: "
                                        "_target_, num_dense, ", "model.hidden=[32]"),
    (["recipe=gpt", "model=[1,2]"], "model=[1,2]: model is a section of keys",
     "model._target_=launcher.recipes.gpt.model.GPT"),
    # Hydra's "Invalid type assigned: int is not a subclass of TrainerConfig"
    (["recipe=gpt", "trainer=5"], "trainer=5: trainer is a section of keys, not a single value; its keys: steps, ",
     "trainer.steps=5"),
    (["recipe=quickstart", "optimizer=adam"], "optimizer=adam: optimizer is a section of keys", "optimizer.name=adam"),
    (["recipe=quickstart", "+model=foo"], "+model=foo: model is a section of keys", "model.hidden=8"),  # Hydra: "Could
    (["recipe=gpt", "++trainer=5"], "++trainer=5: trainer is a section of keys", "++trainer.steps=5"),  # not append"
])
def test_a_single_value_for_a_section_names_its_keys(lines, says, fine):
    with pytest.raises(ConfigError) as e:
        compose_config(lines)
    assert says in e.value.render() and "Set one key at a time, e.g. " in e.value.render(), e.value.render()
    compose_config([lines[0], fine])  # a key of the section, or its class, is still taken


@pytest.mark.parametrize("lines, says", [
    (["recipe=gpt", "=5"], "=5: nothing before the '='. An override is key=value"),  # Hydra raised a ValueError
    (["recipe=gpt", "+=3"], "+=3: nothing before the '='."),
    # the launcher planned wide_deep and Hydra composed gpt: "its file sets recipe.name=gpt"
    (["recipe=wide_deep", "trainer.steps=5", "recipe=gpt"], "recipe= was given 2 times (wide_deep, gpt): a run "
                                                            "trains one recipe."),
])
def test_an_override_without_a_key_or_a_second_recipe_is_refused(lines, says):
    with pytest.raises(ConfigError) as e:
        compose_config(lines)
    assert says in e.value.render(), e.value.render()
    assert compose_config(["recipe=gpt", "recipe=gpt"]).recipe.name == "gpt"  # the same one twice is one recipe


@pytest.mark.parametrize("lines, says", [  # Hydra's grammar: "Error parsing override", "LexerNoViableAltException"
    (["wide_deep"], "wide_deep: a recipe is chosen by key. Write recipe=wide_deep."),
    (["--recipe", "gpt"], "--recipe gpt: hetero-launch takes Hydra's key=value overrides, not --options. Write "
                          "recipe=gpt"),
    (["recipe=gpt", "--trainer.steps=5"], "Write trainer.steps=5"),
    (["recipe=gpt", "trainer.steps", "5"], "trainer.steps 5: an override is one word, key=value. Write "
                                           "trainer.steps=5."),
    (["recipe", "=", "gpt"], "recipe = gpt: no spaces around '='. Write recipe=gpt."),
    (["recipe", "=gpt"], "recipe =gpt: no spaces around '='. Write recipe=gpt."),
    (["recipe=gpt", "foo"], "foo: not an override (key=value). Write foo=<value>, or leave it out."),
    # parsed, then Hydra's "Ambiguous value for argument"
    (["recipe=gpt,wide_deep"], "recipe=gpt,wide_deep: a value with commas (or a range) is a sweep, which runs with "
                               "-m: hetero-launch -m recipe=gpt,wide_deep <the other overrides>."),
    (["recipe=gpt", "model.width=8,16"], "A list is written in brackets: model.width=[...]."),
])
def test_a_word_that_is_not_an_override_is_said_as_the_override_to_write(lines, says):
    with pytest.raises(ConfigError) as e:
        compose_config(lines)
    assert says in e.value.render(), e.value.render()


@pytest.mark.parametrize("line", ["model.hidden=3", "data.path=x.csv", "loss._target_=torch.nn.MSELoss"])
def test_a_recipe_sections_key_with_a_script_says_the_script_brings_its_own(line, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ConfigError) as e:  # before: "model.hidden: no such key (value 3)."
        compose_config([f"script={script}", line])
    assert f"{line} with script=: a script builds its own model, data, optimizer and loop, and nothing in it reads " \
           "this key" in e.value.render(), e.value.render()


def test_adding_a_key_that_is_there_exits_2_with_the_line_that_sets_it(cli, tmp_path):
    res = cli(["recipe=gpt", "+trainer.steps=5", "dry_run=true"], tmp_path)  # Hydra: "Could not append to config"
    assert res.returncode == 2 and ("+trainer.steps=5: trainer.steps is there already (+ adds a key that is not); "
                                    "write trainer.steps=5 to set it.") in res.stderr, res.stderr
    merged = cli(["recipe=wide_deep", "+tables.deep_embedding.lr=0.1", "dry_run=true"], tmp_path)  # into a mapping
    assert merged.returncode == 0, merged.stdout + merged.stderr
