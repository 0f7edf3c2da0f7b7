"""A recipe in the user's own folder (docs/your_model.md's files, verbatim): composed with --config-dir, its model read on
the meta device, planned by intent; each mistake a user makes reported by name before anything starts."""

import os

import pytest
import torch

from launcher.errors import ConfigError
from tests.conftest import plan_of, run_cli
from tests.usercode.readme_project import write_project
from launcher.parallel import RULES


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """One folder for the module: Python caches the user's package ``my_ctr`` after its first import."""
    folder = write_project(tmp_path_factory.mktemp("my_project"), extra=True)
    cwd = os.getcwd()
    os.chdir(folder)
    yield folder
    os.chdir(cwd)


def plan(project, *overrides, host):
    return plan_of(["recipe=my_ctr", *overrides], host, config_dir="conf")


def test_the_model_is_read_on_the_meta_device_and_trains_as_written_without_intents(project, cpu_host):
    p = plan(project, host=cpu_host)
    assert {t.name: (t.rows, t.dim, t.location) for t in p.placement.tables} == {
        "user_emb": (100_000, 16, "engine"), "item_emb": (1_000, 16, "engine")}
    assert p.placement.dense_params == 100_000 * 16 + 1_000 * 16 + (36 * 64 + 64) + (64 + 1)
    assert p.engine == "ddp" and p.eval_metrics == "binary"  # labels are 0/1
    assert p.data["_target_"] == "launcher.usercode.data.UserData" and p.data["eval"]["seed"] == 1
    assert str(project) in p.code_paths


def test_host_device_mix_takes_every_table_out_with_the_optimizers_settings(project, cpu_host):
    p = plan(project, "placement.host_device_mix=1", "optimizer.lr=0.01", host=cpu_host)
    assert {(t.name, t.location, t.optimizer, t.lr) for t in p.placement.tables} == {
        ("user_emb", "host", "lazy_adam", 0.01), ("item_emb", "host", "lazy_adam", 0.01)}
    assert p.placement.dense_params == 36 * 64 + 64 + 64 + 1


def test_a_dotted_table_path_is_one_key(project, cpu_host):
    p = plan(project, "model._target_=my_ctr.extra.Towers", "+placement.tables.towers.0.item_emb=host",
             "tables.towers.0.item_emb.optimizer=ftrl", host=cpu_host)
    got = {t.name: (t.location, t.optimizer) for t in p.placement.tables}
    assert got == {"user_emb": ("device", "lazy_adam"), "towers.0.item_emb": ("host", "ftrl")}


@pytest.mark.parametrize("overrides, message", [
    (["model._target_=my_ctr.model.Nett"],
     r"model._target_=my_ctr.model.Nett \(model in conf/recipe/my_ctr.yaml\) does not import: AttributeError: "
     r"module 'my_ctr.model' has no attribute 'Nett'"),
    (["model._target_=my_ctrl.model.Net"], r"does not import: ModuleNotFoundError: No module named 'my_ctrl'"),
    (["+model.dimm=8"], r"model.dimm=8 \(model in conf/recipe/my_ctr.yaml\): my_ctr.model.Net\(\) has no argument "
                        r"dimm. Did you mean model.dim\? Its arguments: users, items, dim, dense, hidden."),
    (["~model.users"], r"model.users \(model in conf/recipe/my_ctr.yaml\) is required by my_ctr.model.Net\(\)"),
    (["+placement.tables.user_embb=host"], r"placement.tables.user_embb: recipe my_ctr has no table user_embb. "
                                           r"Did you mean placement.tables.user_emb\? Its tables: user_emb, item_emb."),
    (["data._target_=my_ctr.extra.DictItems"], r"model \(conf/recipe/my_ctr.yaml\): its forward fails on a batch of 2 "
                                               r"dataset items \(inputs user=\(2,\)\): TypeError: .*missing 2 required "
                                               r"positional arguments: 'item' and 'dense'. The model is called as "
                                               r"model\(\*\*inputs\)"),
    (["data._target_=my_ctr.extra.DictItems", "data_label=click"], r"data \(conf/recipe/my_ctr.yaml\): item 0 of "
                                                                   r"my_ctr.extra.DictItems has no label key click. Set "
                                                                   r"data_label \(and data_inputs\) to its keys: user, label"),
    (["data._target_=my_ctr.extra.ColumnLabels"],
     r"loss \(conf/recipe/my_ctr.yaml\): BCEWithLogitsLoss rejects the model's output \(2,\) float32 against the "
     r"label \(2, 1\) float32: ValueError: Target size"),
    (["loss.reduction=none"], r"loss \(conf/recipe/my_ctr.yaml\): BCEWithLogitsLoss returns a tensor of shape \(2,\) "
                              r"on a batch of 2 dataset items; the loss must return a scalar \(one number, which "
                              r"backward\(\) and the logged loss take\). Set loss.reduction=mean"),
    (["model.nan_at=5"], r"model.nan_at=5 \(model in conf/recipe/my_ctr.yaml\): my_ctr.model.Net\(\) has no argument "
                         r"nan_at. Its arguments: users, items, dim, dense, hidden.$"),  # no did-you-mean _target_
    (["model.dim=abc"], r"model.dim='abc' \(model in conf/recipe/my_ctr.yaml\): my_ctr.model.Net\(\) takes an int for "
                        r"dim, not a str. Give an integer, e.g. model.dim=16."),
    (["model=null"], r"model \(conf/recipe/my_ctr.yaml\) is null: a recipe of your own needs its model, a mapping "
                     r"with a _target_"),
    (["loss=null"], r"loss \(conf/recipe/my_ctr.yaml\) is null: .* \(e.g. loss: \{_target_: "
                    r"torch.nn.BCEWithLogitsLoss\}\)"),
    (["model._target_=5"], r"model._target_=5 \(conf/recipe/my_ctr.yaml\) is no dotted path: give the class's as a "
                           r"string, e.g. model._target_=my_project.model.Net."),
    (["data._target_=null"], r"data._target_=None \(conf/recipe/my_ctr.yaml\) is no dotted path"),
    (["model._target_=my_ctr.model"], r"model._target_=my_ctr.model \(model in conf/recipe/my_ctr.yaml\) is a module, "
                                      r"not a class or function: give the one in it to build, e.g. "
                                      r"model._target_=my_ctr.model.\w+"),
])
def test_each_mistake_is_named(project, cpu_host, overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan(project, *overrides, host=cpu_host)


def test_what_every_rank_would_fail_on_is_refused_before_launch(project, cpu_host):
    """A float64 model (the ranks hand it float32 floats), sparse gradients inside the parts with an optimizer that
    cannot take them, binary metrics on integer class labels: each worked as a plain torch loop or a dry run, then
    failed in every rank."""
    with pytest.raises(ConfigError, match=r"model \(conf/recipe/my_ctr.yaml\): its parameters net.user_emb.weight, "
                                          r"net.item_emb.weight, .* are torch.float64, and precision=fp32 trains in "
                                          r"float32.* Build the model in float32"):
        plan(project, "model._target_=my_ctr.extra.Double", host=cpu_host)
    sparse = "model._target_=my_ctr.extra.SparseGrads"
    with pytest.raises(ConfigError, match=r"model: net.user_emb is built with sparse=True, .* optimizer.name=adam "
                                          r"\(torch.optim.Adam\) cannot take.*tables.net.user_emb.optimizer="
                                          r"lazy_adam .* optimizer.name to one that takes sparse gradients \(sgd, "
                                          r"momentum; optimizer.weight_decay=0\), or build it with sparse=False"):
        plan(project, sparse, host=cpu_host)
    with pytest.raises(ConfigError, match=r"optimizer.name=sgd with optimizer.weight_decay=0.01 \(torch.optim.SGD\) "
                                          r"cannot take"):
        plan(project, sparse, "optimizer.name=sgd", "optimizer.weight_decay=0.01", host=cpu_host)
    for fix in ("optimizer.name=sgd", "tables.net.user_emb.optimizer=lazy_adam", "placement.host_device_mix=1"):
        plan(project, sparse, fix, host=cpu_host)
    classes = ["model._target_=my_ctr.extra.TwoClasses", "data._target_=my_ctr.int_clicks.IntClicks",
               "eval_data._target_=my_ctr.int_clicks.IntClicks", "loss._target_=torch.nn.CrossEntropyLoss"]
    assert plan(project, *classes, host=cpu_host).eval_metrics == "loss"  # auto
    with pytest.raises(ConfigError, match=r"eval.metrics=binary: AUC, log loss and accuracy score one output of the "
                                          r"model per label, each label 0 or 1 \(a float\), and recipe my_ctr's are "
                                          r"not .* Set eval.metrics=loss"):
        plan(project, *classes, "eval.metrics=binary", host=cpu_host)
    assert plan(project, "eval.metrics=binary", host=cpu_host).eval_metrics == "binary"  # its 0/1 clicks


@pytest.mark.skipif(torch.cuda.is_available(), reason="the model's .to('cuda') works where CUDA is")
def test_a_model_that_moves_itself_to_cuda_is_told_to_leave_it_to_the_launcher(project, cpu_host):
    with pytest.raises(ConfigError, match=r"building my_ctr.extra.OnCuda on the meta device failed: .*CUDA.* Build "
                                          r"the model where it is made \(no .cuda\(\), .to\('cuda'\) or "
                                          r"device='cuda' in its constructor\)"):
        plan(project, "model._target_=my_ctr.extra.OnCuda", host=cpu_host)


def test_a_model_that_reads_a_parameters_value_in_its_constructor_is_told_why_and_what_to_do(project, cpu_host):
    with pytest.raises(ConfigError, match=r"building my_ctr.extra.ReadsAValue on the meta device failed: .*meta.* The "
                                          r"launcher builds the model on the meta device \(shapes, no memory\) to plan "
                                          r"it before any rank starts, and a meta tensor has no values: read no "
                                          r"parameter's value in the constructor \(.item\(\)"):
        plan(project, "model._target_=my_ctr.extra.ReadsAValue", host=cpu_host)


@pytest.mark.parametrize("model, why", [("Frozen", r"all [\d,]+ are frozen: requires_grad=False"),
                                         ("NoParameters", "it has none")])
def test_a_model_with_nothing_to_train_is_refused(project, cpu_host, model, why):
    with pytest.raises(ConfigError, match=rf"model \(conf/recipe/my_ctr.yaml\): none of its parameters requires a "
                                          rf"gradient \({why}\): there is nothing to train"):
        plan(project, f"model._target_=my_ctr.extra.{model}", host=cpu_host)


def test_a_model_that_cannot_take_one_item_is_refused_a_micro_batch_of_one(project, cpu_host):
    model = "model._target_=my_ctr.extra.Normalized"
    for key, fix in (("batch.global_size=2", "batch.global_size=4 or more."),
                     ("batch.micro_size=1", "batch.micro_size=2.")):
        with pytest.raises(ConfigError, match=rf"{key}: a micro-batch of 1 item on each data-parallel rank .* the model "
                                              rf"cannot take 1 item: model \(conf/recipe/my_ctr.yaml\): its forward "
                                              rf"fails on a batch of 1 dataset item .*Expected more than 1 value per "
                                              rf"channel when training.* Give at least 2 items a micro-batch: {fix}"):
            plan(project, model, key, "cluster.nproc_per_node=2", host=cpu_host)
    assert plan(project, model, "batch.global_size=4", "cluster.nproc_per_node=2", host=cpu_host).batch.micro_size == 2


def test_a_layer_the_forward_never_calls_takes_ddp_without_torch_ddp(project, cpu_host):
    """torch DDP stops at the second step when a parameter gets no gradient; the flat all-reduce takes it as one
    process does (tests/integration/test_user_recipe.py trains it)."""
    for overrides in ([], ["placement.host_device_mix=1"]):
        p = plan(project, "model._target_=my_ctr.extra.Unused", *overrides, host=cpu_host)
        assert p.parts[0].config["implementation"].startswith("one flat all-reduce")
        assert any(n.startswith("ddp: spare.weight, spare.bias got no gradient") for n in p.notes), p.notes
    assert plan(project, host=cpu_host).parts[0].config["implementation"] == "torch DistributedDataParallel"


@pytest.mark.parametrize("overrides", [["loss.reduction=sum"], ["+loss.reduction=sum"],
                                       ["loss={_target_: torch.nn.BCEWithLogitsLoss, reduction: sum}"]])
def test_loss_and_model_keys_are_their_constructors_arguments(project, cpu_host, overrides):
    """Keys the recipe's file does not list are still arguments (docs/your_model.md: loss keys are its constructor's)."""
    p = plan(project, *overrides, "model.hidden=32", host=cpu_host)
    assert p.loss == {"_target_": "torch.nn.BCEWithLogitsLoss", "reduction": "sum"} and p.model["hidden"] == 32


def test_names_from_the_model_are_shown_not_obeyed(project, cpu_host):
    import io

    from rich.console import Console

    from launcher.report.plan_view import placement_table

    (project / "my_ctr" / "odd.py").write_text(
        "import torch\nfrom torch import nn\n\nclass Odd(nn.Module):\n    def __init__(self, users: int, items: int):\n"
        "        super().__init__()\n        self.t = nn.ModuleDict({'\\x1b[31mred\\x07': nn.Embedding(users, 4), "
        "'[bold]b': nn.Embedding(items, 4)})\n        self.head = nn.Linear(12, 1)\n\n"
        "    def forward(self, user, item, dense):\n        t = list(self.t.values())\n"
        "        return self.head(torch.cat([t[0](user), t[1](item), dense], dim=1)).squeeze(-1)\n")
    p = plan(project, "model._target_=my_ctr.odd.Odd", "~model.dim", host=cpu_host)
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False).print(placement_table(p))
    assert "\x1b" not in out.getvalue() and "\\x1b[31mred\\x07" in out.getvalue() and "[bold]b" in out.getvalue()


def test_every_mistake_at_once(project, cpu_host):
    with pytest.raises(ConfigError) as e:
        plan(project, "+model.dimm=8", "+data.nn=3", "loss._target_=torch.nn.BCELos", host=cpu_host)
    text = e.value.render()
    assert "model.dimm" in text and "data.nn" in text and "torch.nn.BCELos" in text


def test_the_cli_exits_2_before_any_rank(project):
    res = run_cli(["--config-dir", "conf", "recipe=my_ctr", "model._target_=my_ctr.model.Nett"], project)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "does not import" in res.stderr and "Traceback" not in res.stderr + res.stdout
    assert not (project / "log_output").exists()


def test_config_dir_mistakes(project, tmp_path, cli):
    res = cli(["--config-dir", "confs", "recipe=my_ctr"], project)
    assert res.returncode == 2 and "--config-dir confs: no such directory" in res.stderr
    res = cli(["--config-dir", "conf", "recipe=my_ct"], project)
    assert res.returncode == 2 and "Did you mean recipe=my_ctr?" in res.stderr, res.stderr
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "gpt.yaml").write_text("# @package _global_\nrecipe: {name: gpt}\n")
    res = cli(["--config-dir", "conf", "recipe=gpt"], tmp_path)
    assert res.returncode == 2 and "has the name of a built-in recipe" in res.stderr


def test_a_config_dir_whose_recipes_are_elsewhere_says_where(project, tmp_path, cli):
    """--config-dir at the recipe/ folder itself, a recipes/ folder, .yml files, a file: each said with its fix
    (each said "no such recipe" with only the built-in recipes, and with a built-in recipe did nothing)."""
    text = (project / "conf" / "recipe" / "my_ctr.yaml").read_text()
    for where, name in (("a/conf/recipe", "my_ctr.yaml"), ("b/conf/recipes", "my_ctr.yaml"),
                        ("c/conf/recipe", "my_ctr.yml")):
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / name).write_text(text)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "conf.yaml").write_text("x: 1\n")
    for config_dir, said in (("a/conf/recipe", "--config-dir a/conf/recipe: no recipe/<name>.yaml in it, where "
                                                "hetero-launch reads your recipes; my_ctr.yaml lie in the recipe/ "
                                                "folder itself: give the folder above it, --config-dir a/conf."),
                             ("b/conf", "it has recipes/ (plural): rename that folder to b/conf/recipe"),
                             ("c/conf", "my_ctr.yml end in .yml: rename them to .yaml"),
                             ("d/conf.yaml", "--config-dir d/conf.yaml: a file, not a folder.")):
        for recipe in ("my_ctr", "quickstart"):
            res = cli(["--config-dir", config_dir, f"recipe={recipe}", "dry_run=true"], tmp_path)
            out = " ".join(res.stderr.split())
            assert res.returncode == 2 and said in out, (config_dir, recipe, out)


def test_hydra_flags_see_the_users_config_tree(project, cli):
    res = cli(["--config-dir", "conf", "recipe=my_ctr", "--cfg", "job"], project)
    assert res.returncode == 0, res.stderr
    assert "_target_: my_ctr.model.Net" in res.stdout and "eval_data:" in res.stdout


@pytest.mark.parametrize("line, said", [
    ("model: my_ctr.model.Net", "model: 'my_ctr.model.Net' (conf/recipe/my_ctr.yaml) is a str, where a recipe of your "
                                "own takes a mapping with a _target_ (the dotted path of a class) and its arguments. "
                                "Write model: {_target_: my_ctr.model.Net}, or model._target_=<module.Class> on the "
                                "command line."),
    ("model: [1, 2]", "model: [1, 2] (conf/recipe/my_ctr.yaml) is a list, where a recipe of your own takes a mapping"),
    ("model: null", "model (conf/recipe/my_ctr.yaml) is null"),
    ("model: {_target_: null}", "model._target_=None (conf/recipe/my_ctr.yaml) is no dotted path"),
    ("model: {hidden: 8}", "model (conf/recipe/my_ctr.yaml) needs a _target_: the dotted path of a class, e.g. model: "
                           "{_target_: <module.Class>, <its arguments>...}"),
])
def test_a_section_that_is_no_target_spec_in_the_file_is_named(project, tmp_path, cli, line, said):
    """A section written as a string, a list or null (a newcomer's ``model: my_pkg.Net``), or a _target_ that is no
    string: the form to write, exit 2 (each was a traceback in the launcher, exit 1)."""
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    lines = (project / "conf" / "recipe" / "my_ctr.yaml").read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("model:"))
    end = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith(" "))  # the section's indented lines
    (tmp_path / "conf" / "recipe" / "my_ctr.yaml").write_text("\n".join(lines[:at] + [line] + lines[end:]) + "\n")
    res = cli(["--config-dir", "conf", "recipe=my_ctr", "dry_run=true"], tmp_path)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and said in out and "Traceback" not in out, out[-2000:]


def test_a_recipe_file_without_the_package_header_is_named(project, tmp_path, cli):
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    text = (project / "conf" / "recipe" / "my_ctr.yaml").read_text().replace("# @package _global_\n", "")
    (tmp_path / "conf" / "recipe" / "my_ctr.yaml").write_text(text)
    res = cli(["--config-dir", "conf", "recipe=my_ctr"], tmp_path)
    assert res.returncode == 2 and "its first line must be `# @package _global_`" in res.stderr, res.stderr


@pytest.mark.parametrize("before, after, said", [
    ("\ufeff# @package _global_\n", "", "it starts with a byte-order mark (U+FEFF, which some editors write)"),
    ("# my recipe\n\n# @package _global_\n", "", "`# @package _global_` is in it but not at its top, where Hydra reads"),
    ("", "# @package _global_\n", "`# @package _global_` is in it but not at its top"),
    ("# @package model\n", "", "its header sets `@package model`; a recipe's is `# @package _global_`"),
])
def test_a_package_header_hydra_would_not_read_is_named(project, tmp_path, cli, before, after, said):
    """The header where Hydra reads it (its first `# @` lines): a byte-order mark or a comment before it, or the line
    at the file's end, made Hydra put the file under recipe. and say "Key 'recipe' not in 'RecipeConfig'"."""
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    text = (project / "conf" / "recipe" / "my_ctr.yaml").read_text().replace("# @package _global_\n", "")
    (tmp_path / "conf" / "recipe" / "my_ctr.yaml").write_text(before + text + after, encoding="utf-8")
    res = cli(["--config-dir", "conf", "recipe=my_ctr"], tmp_path)
    out = " ".join(res.stderr.split())
    assert res.returncode == 2 and f"conf/recipe/my_ctr.yaml: {said}" in out, out


@pytest.mark.parametrize("edit, said", [
    (("trainer: {", "trainer: {stepz: 3, "), "conf/recipe/my_ctr.yaml: trainer.stepz: no such key. Did you mean "
                                            "trainer.steps? Correct it, or remove it from the file."),
    (("trainer: {steps: 100}", "trainer: {steps: ten}"), "conf/recipe/my_ctr.yaml: trainer.steps: Value 'ten' of type 'str' "
                                              "could not be converted to Integer. Correct the value in the file."),
    (("trainer: {steps: 100}", "trainer: {steps: ${model.dim}}"), "not valid YAML: expected ',' or '}', but got '{' "
     "(while parsing a flow mapping begun at line"),
    (("trainer: {steps: 100}", "trainer: {steps: ${model.dim}}"), "Quote the interpolation: inside { } or [ ], YAML "
                                                                 "reads ${...} as a mapping"),
    (("trainer: {steps: 100}", "trainer: {steps: '${model.nope}'}"), "trainer.steps: Interpolation key 'model.nope' not "
     "found. Fix it in conf/recipe/my_ctr.yaml, or set it on the command line: trainer.steps=<value>."),
    (("recipe: {", "defaults: [my_base, _self_]\nrecipe: {"),
     "conf/recipe/my_ctr.yaml: its defaults list names recipe/my_base, which is no config file: neither "
     "conf/recipe/my_base.yaml nor one of hetero-launch's own."),
    # a root group in the file's defaults: Hydra said "Multiple values for placement. To override a value use
    # 'override placement: None'", and with that override "Could not override 'placement'"
    *((("recipe: {", f"defaults: [{entry}, _self_]\nrecipe: {{"),
       "conf/recipe/my_ctr.yaml: its defaults list names /placement, which hetero-launch's root config picks after "
       "the recipe (Hydra allows one, and no override of it from a recipe file). Remove the entry, and give "
       "placement=auto on the command line, or write that option's keys in the file's body (placement=auto sets "
       "{placement: {mode: auto}}, which your file may hold).")
      for entry in ("/placement: auto", "override /placement: auto")),
])
def test_a_mistake_inside_the_recipe_file_names_the_file_and_the_key(project, tmp_path, cli, edit, said):
    """The mistakes the command line gets a did-you-mean for, written in the file: Hydra's words were "In
    'recipe/my_ctr': ConfigKeyError raised while composing config: Key 'stepz' not in 'TrainerConfig'"."""
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    text = (project / "conf" / "recipe" / "my_ctr.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "conf" / "recipe" / "my_ctr.yaml").write_text(text.replace(edit[0], edit[1], 1))
    res = cli(["--config-dir", "conf", "recipe=my_ctr"], tmp_path)
    out = " ".join(res.stderr.split())
    assert res.returncode == 2 and said in out, out


def test_a_recipe_file_without_its_sections_is_told_to_write_them_there(tmp_path, cli):
    """model=<value> on the command line is refused (a section of keys): the advice is the file's form."""
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "bare.yaml").write_text("# @package _global_\nrecipe: {name: bare}\n")
    res = cli(["--config-dir", "conf", "recipe=bare"], tmp_path)
    out = " ".join(res.stderr.split())
    assert res.returncode == 2 and "on the command line" not in out, out
    for key in ("model", "data", "loss"):
        assert f"{key} is required and not set. Give it in conf/recipe/bare.yaml: {key}: {{_target_: " in out, out


def test_a_hydra_section_in_a_recipe_file_is_refused_as_on_the_command_line(project, tmp_path, cli):
    """Hydra reads a hydra: section from its primary config only, never from a recipe: it did nothing, silently."""
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    text = (project / "conf" / "recipe" / "my_ctr.yaml").read_text()
    (tmp_path / "conf" / "recipe" / "my_ctr.yaml").write_text(text + "hydra: {run: {dir: outs}, job: {chdir: true}}\n")
    res = cli(["--config-dir", "conf", "recipe=my_ctr"], tmp_path)
    out = " ".join(res.stderr.split())
    assert res.returncode == 2, out
    assert ("conf/recipe/my_ctr.yaml: hydra.run.dir=outs: Hydra's own run settings do nothing here (hetero-launch "
            "composes the config with Hydra and runs the job itself): a run's files go to output.log_dir/<run name>: "
            "set output.log_dir=outs") in out
    assert "conf/recipe/my_ctr.yaml: hydra.job.chdir=True: Hydra's own run settings do nothing here" in out


def test_a_config_dir_with_a_comma_in_its_path(project, tmp_path, cpu_host):
    import shutil

    odd = tmp_path / "a,b [x]"
    shutil.copytree(project / "conf", odd / "conf")
    assert plan_of(["recipe=my_ctr"], cpu_host, config_dir=str(odd / "conf")).recipe == "my_ctr"


@pytest.mark.parametrize("line, rewritten", [
    ("placement.tables.towers.0.item_emb=host", "+placement.tables={towers.0.item_emb: host}"),
    ("+placement.tables.towers.0.item_emb=host", "+placement.tables={towers.0.item_emb: host}"),
    ("placement.tables.user_emb=host", "+placement.tables={user_emb: host}"),
    ("tables.towers.0.item_emb.optimizer=ftrl", "+tables={towers.0.item_emb: {optimizer: ftrl}}"),
    ("tables.towers.0.item_emb={optimizer: ftrl}", "+tables={towers.0.item_emb: {optimizer: ftrl}}"),
    ("tables.user_emb.lr=0.1", "+tables={user_emb: {lr: 0.1}}"),
    ("~placement.tables.user_emb", "~placement.tables.user_emb"),
])
def test_dotted_table_paths_become_one_key(line, rewritten):
    from launcher.config import table_path_override

    assert table_path_override(line) == rewritten


def test_a_table_the_recipe_does_not_list_takes_keys_field_by_field(project):
    """Hydra refuses a new key of a typed dict given field by field (+tables.x.optimizer=ftrl: 'dict is not a
    subclass of TableConfig'); the launcher merges it as one entry, with or without +."""
    from launcher.config import compose_config

    cfg = compose_config(["recipe=my_ctr", "tables.user_emb.optimizer=ftrl", "+tables.item_emb.lr=0.5",
                          "placement.tables.user_emb=host"], str(project / "conf"))
    assert cfg.tables.user_emb.optimizer == "ftrl" and cfg.tables.item_emb.lr == 0.5
    assert cfg.placement.tables == {"user_emb": "host"}


def test_a_script_run_takes_table_placement_it_cannot_check_yet(cpu_host, tmp_path):
    from launcher.config import compose_config
    from launcher.backends import BACKENDS
    from launcher.plan.script import plan_script

    script = tmp_path / "train.py"
    script.write_text("")
    plan = plan_script(compose_config([f"script={script}", "+placement.tables.towers.0.item_emb=host",
                                       "optimizer.target=CPU"]), cpu_host, backends=tuple(BACKENDS.values()), parts=RULES)
    assert plan.runtime["table_locations"] == {"towers.0.item_emb": "host"} and [p["name"] for p in plan.runtime["parts"]] == ["deepspeed"]
    with pytest.raises(ConfigError, match="optimizer.cpu_impl=deepspeed builds DeepSpeedCPUAdam for a recipe"):
        plan_script(compose_config([f"script={script}", "optimizer.target=CPU", "optimizer.cpu_impl=deepspeed"]),
                    cpu_host, backends=tuple(BACKENDS.values()), parts=RULES)


def test_class_labels_are_not_binary(project, cpu_host):
    """Integer 0/1 labels for a 2-class CrossEntropyLoss: eval.metrics=auto stays loss (AUC needs one score)."""
    extra = project / "my_ctr" / "classes.py"
    extra.write_text(
        "import torch\nfrom torch import nn\nfrom my_ctr.data import Clicks\n\n"
        "class Classes(Clicks):\n    def __getitem__(self, i):\n"
        "        return self.user[i], self.item[i], self.dense[i], self.label[i].long()\n\n"
        "class TwoWay(nn.Module):\n    def __init__(self, users: int, items: int):\n        super().__init__()\n"
        "        self.user_emb = nn.Embedding(users, 4)\n        self.head = nn.Linear(4 + 4, 2)\n\n"
        "    def forward(self, user, item, dense):\n"
        "        return self.head(torch.cat([self.user_emb(user), dense], dim=1))\n")
    p = plan(project, "model._target_=my_ctr.classes.TwoWay", "~model.dim", "data._target_=my_ctr.classes.Classes",
             "eval_data._target_=my_ctr.classes.Classes", "loss._target_=torch.nn.CrossEntropyLoss", host=cpu_host)
    assert p.eval_metrics == "loss"


def test_smoke_without_a_profile_runs_two_steps_on_two_ranks_over_a_few_batches(project, cpu_host):
    p = plan(project, "smoke=true", host=cpu_host)
    assert (p.steps, p.world_size, p.eval_max_batches, p.device_type) == (2, 2, 2, "cpu")
    p = plan(project, "smoke=true", "+smoke_profile={model: {users: 500}, data: {n: 2000, users: 500}}", host=cpu_host)
    assert p.model["users"] == 500 and p.data["train"]["n"] == 2000
    assert any("model.users: 100000 -> 500" in n for n in p.notes)


def test_a_pipeline_stages_the_models_children_when_its_forward_is_them_in_order(project, cpu_host):
    p = plan(project, "model._target_=my_ctr.extra.Staged", "parallel.pipeline_stages=2", "batch.micro_batches=2",
             host=cpu_host)
    assert [x.name for x in p.parts] == ["ddp", "pipeline"]
    assert [s.layers for s in p.pipeline.stages] == [("features",), ("hidden", "out")]
    assert p.pipeline.split == "chain"
    p = plan(project, "parallel.pipeline_stages=2", host=cpu_host)  # no chain: cut from its forward's graph
    assert p.pipeline.split == "graph"
    assert [s.layers for s in p.pipeline.stages] == [("user_emb",), ("item_emb", "mlp")]  # by parameters


def test_a_script_is_not_pipelined(tmp_path, cpu_host):
    from launcher.config import compose_config
    from launcher.backends import BACKENDS
    from launcher.plan.script import plan_script

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ConfigError, match=r"parallel.pipeline_stages=2 with script=: runtime.prepare\(\) trains your "
                                          r"loop data-parallel"):
        plan_script(compose_config([f"script={script}", "parallel.pipeline_stages=2"]), cpu_host, backends=tuple(BACKENDS.values()), parts=RULES)


@pytest.mark.parametrize("overrides, traced", [([], False), (["placement.mode=auto"], True), (["recompute=[mlp]"], True)])
def test_the_activations_are_traced_where_the_plan_needs_them(project, overrides, traced):
    """placement.mode=auto chooses the recompute set and predicts memory from the per-layer trace, as recompute
    shows it; other runs leave it out."""
    from launcher.config import compose_config
    from launcher.facts.preflight import gather_facts

    facts = gather_facts(compose_config(["recipe=my_ctr", *overrides], "conf"), "conf")
    assert (facts.activations is not None) == traced
    if traced:
        assert set(facts.activations) == set(facts.model.layers) and all(
            v["saved"] > 0 for v in facts.activations.values())


VAL = "+val_data={_target_: my_ctr.data.Clicks, n: 600, users: 100000, items: 1000, seed: 2}"


def test_val_data_is_a_validation_split_watched_by_early_stopping(project, cpu_host):
    p = plan(project, VAL, "eval.every=5", "trainer.early_stop.patience=2", "trainer.early_stop.metric=auc",
             host=cpu_host)
    assert (p.val_every, p.eval_every, p.early_stop.mode) == (5, 0, "max")
    assert p.data["val"]["n"] == 600 and any("validation: 600 samples scored every 5 steps" in n for n in p.notes)
    assert "val" not in plan(project, host=cpu_host).data  # none given: the data spec is as it was


def test_val_data_is_refused_where_it_cannot_work(project, cpu_host, tmp_path):
    (project / "my_ctr" / "streamed.py").write_text(
        "import torch\nfrom torch.utils.data import IterableDataset\n\n"
        "class Stream(IterableDataset):\n    def __iter__(self):\n"
        "        for i in range(8):\n            yield torch.tensor(i % 100), torch.tensor(i % 10), torch.zeros(4), "
        "torch.tensor(1.0)\n")
    with pytest.raises(ConfigError, match="val_data: Stream is an IterableDataset; a validation split is a map-style"):
        plan(project, "+val_data={_target_: my_ctr.streamed.Stream}", host=cpu_host)
    with pytest.raises(ConfigError, match="val_data is for recipes in your own folder; recipe wide_deep"):
        plan_of(["recipe=wide_deep", "+val_data={_target_: my_ctr.data.Clicks}"], cpu_host)


def test_a_stream_shorter_than_one_global_micro_batch_exits_2(project, cpu_host, cli):
    """The launcher reads a stream's first items; one that ended there with fewer than a global micro-batch crashed
    every rank with EmptyStream (exit 1). A map-style Dataset that short is refused in the same words."""
    (project / "my_ctr" / "short_stream.py").write_text(
        "import torch\nfrom torch.utils.data import IterableDataset\n\n"
        "class Stream(IterableDataset):\n    def __init__(self, n: int, users: int, items: int):\n"
        "        self.n = n\n\n"
        "    def __iter__(self):\n        for i in range(self.n):\n"
        "            yield torch.tensor(i % 100), torch.tensor(i % 10), torch.zeros(4), torch.tensor(float(i % 2))\n")
    stream = ["data._target_=my_ctr.short_stream.Stream", "data.n=10"]
    res = cli(["--config-dir", "conf", "recipe=my_ctr", *stream, "batch.global_size=16"], project)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "Traceback" not in err, err
    assert ("data is a stream (IterableDataset) that ended after 10 items when the launcher read it, fewer than one "
            "global micro-batch (batch.micro_size 8 × dp 2 = 16): no epoch of it would hold a micro-batch. Lower "
            "batch.global_size (or batch.micro_size), or give more data.") in err
    assert not (project / "log_output").exists()
    plan(project, *stream, "batch.global_size=10", host=cpu_host)  # 10 items: one global micro-batch
    plan(project, stream[0], "data.n=1000", "batch.global_size=512", host=cpu_host)  # it did not end in the read
    # Longer than the first items the launcher keeps (256): counted on to a global batch, without keeping them.
    with pytest.raises(ConfigError, match=r"ended after 600 items when the launcher read it, fewer than one global "
                                          r"micro-batch \(batch.micro_size 512 × dp 2 = 1024\)"):
        plan(project, stream[0], "data.n=600", "batch.global_size=1024", host=cpu_host)


def test_eval_keys_without_held_out_data_are_refused_by_name(project, cpu_host):
    """eval_data=null and no validation split: no evaluation runs, so eval.every / max_batches / metrics would do
    nothing (before, only the generic 'no evaluation' note); eval.batches=0 says so itself, and a smoke run's own
    eval.* values are not the user's."""
    with pytest.raises(ConfigError) as e:
        plan(project, "eval_data=null", "eval.every=3", "eval.max_batches=2", "eval.metrics=loss", host=cpu_host)
    said = " ".join(str(e.value).split())
    for key in ("eval.every=3", "eval.max_batches=2", "eval.metrics=loss"):
        assert f"{key}: this run has no held-out data (eval_data is null" in said, said
    assert "Give eval_data: {_target_: ...}" in said
    assert any(n.startswith("no eval_data: no evaluation") for n in plan(project, "eval_data=null", host=cpu_host).notes)
    plan(project, "eval_data=null", "eval.batches=0", host=cpu_host)
    plan(project, "eval_data=null", "smoke=true", host=cpu_host)


def test_a_functional_loss_is_taken_as_a_partial_or_refused_as_a_function(project, cpu_host):
    """loss: {_target_: <a function>}: before, 'Set loss.input=<value>' and 'loss.target=...' (the call's own
    arguments); a partial (_partial_: true) is what the worker calls as loss(output, label)."""
    fn = "loss._target_=torch.nn.functional.binary_cross_entropy_with_logits"
    with pytest.raises(ConfigError, match=r"loss._target_=torch.nn.functional.binary_cross_entropy_with_logits "
                                          r"\(loss in conf/recipe/my_ctr.yaml\) is a function, not a class: .* Set "
                                          r"loss._partial_=true") as e:
        plan(project, fn, host=cpu_host)
    assert "loss.input" not in str(e.value)
    p = plan(project, fn, "+loss._partial_=true", host=cpu_host)
    assert p.loss == {"_target_": "torch.nn.functional.binary_cross_entropy_with_logits", "_partial_": True}


def test_the_users_omp_num_threads_is_kept_as_torchrun_keeps_it(project, cpu_host):
    """Before, OMP_NUM_THREADS=2 in the launcher's environment became 1 in every rank, unsaid."""
    import dataclasses

    p = plan(project, host=dataclasses.replace(cpu_host, omp_threads="2"))
    assert {r.env["OMP_NUM_THREADS"] for r in p.ranks} == {"2"}
    assert any(n.startswith("OMP_NUM_THREADS=2 from your environment: kept in every rank, as torchrun") for n in p.notes)
    assert {r.env["OMP_NUM_THREADS"] for r in plan(project, host=cpu_host).ranks} == {"1"}
    with pytest.raises(ConfigError, match=r"OMP_NUM_THREADS='abc' in the launcher's environment: .* whole number"):
        plan(project, host=dataclasses.replace(cpu_host, omp_threads="abc"))


def test_a_held_out_stream_is_said_to_be_read_eval_batches_at_a_time(project, cpu_host):
    """A finite IterableDataset as eval_data is read eval.batches global micro-batches an evaluation (a stream need
    not end): the data line says so, where it would otherwise look scored whole."""
    from launcher.config import compose_config
    from launcher.facts.preflight import gather_facts

    (project / "my_ctr" / "held_stream.py").write_text(
        "import torch\nfrom torch.utils.data import IterableDataset\n\n"
        "class Stream(IterableDataset):\n"
        "    def __init__(self, n=251, users=0, items=0, seed=0):\n        self.n = n\n\n"
        "    def __iter__(self):\n        for i in range(self.n):\n"
        "            yield torch.tensor(i % 100), torch.tensor(i % 10), torch.zeros(4), torch.tensor(1.0)\n")
    cfg = compose_config(["recipe=my_ctr", "eval_data._target_=my_ctr.held_stream.Stream"], "conf")
    [line, *_] = gather_facts(cfg, "conf").data.lines
    assert line.endswith("eval_data: a stream (IterableDataset), of which each evaluation reads eval.batches global "
                         "micro-batches (a stream need not end: raise eval.batches to read more)"), line
