"""Before planning and before any process starts: the user's inputs on disk, and the facts of the recipe's data.

A missing script or an unreadable data file is reported like a config error (exit 2). The facts (sizes the model
needs, samples per epoch, reference numbers; for a recipe in the user's folder also the model's tables and size,
found on the meta device) come from the recipe's hooks and go into the plan as an input, as HostFacts do; the
composed config is never changed."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import sys
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from launcher.backends import BACKENDS
from launcher.contract import Facts, ModelFacts, model_facts
from launcher.errors import ConfigError, few, first_line
from launcher.facts.recipe_targets import check_names, check_replaced
from launcher.manifest import manifest_problems
from launcher.parallel.choose import LATER_KEYS, checkpoint_layout, trained_data
from launcher.plan import LaunchPlan
from launcher.report.runs import latest_trained
from launcher.rundir import CheckpointDir, RunDir, SweepDir

if TYPE_CHECKING:
    from rich.console import Console


def check_script(cfg: DictConfig) -> None:
    """The script is a file that Python can compile: a syntax error is refused here, as ``python script.py`` refuses
    it before running a line, not by every rank (a compiled .pyc or a zip application runs as it is)."""
    path = Path(cfg.script)
    if path.is_dir():
        inside = path / "__main__.py"
        raise ConfigError(f"script={cfg.script} is a folder, not a Python script. Give the script in it: "
                          f"script={inside if inside.is_file() else path / '<script>.py'}.")
    if not path.is_file():
        raise ConfigError(
            f"script={cfg.script}: no such file (relative paths start at {Path.cwd()}). "
            f"Give the path of a Python script, e.g. script=path/to/train.py."
        )
    source = path.read_bytes()
    if source.startswith(importlib.util.MAGIC_NUMBER) or zipfile.is_zipfile(path):
        return
    try:
        compile(source, str(path), "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # IndentationError, TabError; null bytes (a ValueError before 3.11.4)
        if getattr(e, "lineno", None) is None:
            raise ConfigError(f"script={cfg.script}: not a Python source ({e}). Give a Python script, a compiled .pyc "
                              f"or a zip application (.pyz).") from None
        where = f"line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
        code = f": {e.text.strip()!r}" if e.text and e.text.strip() else ""
        raise ConfigError(f"script={cfg.script}: Python cannot compile it ({type(e).__name__} at {where}{code}: "
                          f"{e.msg}), so no rank could run it. Fix that line; python -m py_compile {cfg.script} "
                          f"checks it without running it.") from None


def resume_checkpoint(cfg: DictConfig) -> str:
    """trainer.resume=<run dir>|latest -> the newest complete checkpoint of that run ('' when trainer.resume is
    empty). latest is output.log_dir's latest link, read before this run replaces it."""
    resume = str(cfg.trainer.resume)
    if not resume:
        return ""
    key = f"trainer.resume={resume}"
    if cfg.trainer.resume_from:
        raise ConfigError(f"{key} and trainer.resume_from={cfg.trainer.resume_from}: give one. trainer.resume takes a "
                          f"run dir (or latest), trainer.resume_from one of its checkpoints/step<N> folders.")
    path = Path(cfg.output.log_dir) / "latest" if resume == "latest" else Path(resume)
    if resume == "latest":  # the newest run that trained: a dry run since then has nothing to resume
        path = latest_trained(path)[0]
    try:
        run = RunDir(path.resolve())
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (pathlib, Python < 3.13)
        raise ConfigError(f"{key}: {path} cannot be followed ({e}): a symlink that leads back to itself. Give a run "
                          f"dir itself, trainer.resume=log_output/<run>; remove the link (rm {path}) if it is "
                          f"log_dir's latest.") from None
    if not run.plan.is_file() and SweepDir(run.path).json.is_file():  # a sweep: its jobs are the run dirs
        jobs = sorted((p for p in run.path.iterdir() if p.name.isdigit() and RunDir(p).plan.is_file()),
                      key=lambda p: int(p.name))
        raise ConfigError(f"{key}: {path} is a sweep ({run.path.name}), whose jobs are the run dirs under it"
                          f"{' (' + ', '.join(p.name for p in jobs) + ')' if jobs else ''}. Give the job to resume, "
                          f"e.g. trainer.resume={path / (jobs[-1].name if jobs else '0')}.")
    if not run.plan.is_file() and resume == "latest":
        raise ConfigError(f"{key}: output.log_dir={cfg.output.log_dir} holds no run to resume ({path} is no run "
                          f"dir). Start the run without trainer.resume, give the run dir to resume "
                          f"(trainer.resume=<log dir>/<run>), or set output.log_dir to the folder its runs are in.")
    if not run.plan.is_file():
        raise ConfigError(f"{key}: {path} is not a run dir (no {run.plan.name} in it). Give a run dir such as "
                          f"log_output/<run>, or latest for output.log_dir's newest run.")
    newest = run.newest_checkpoint()
    if newest is None:
        raise ConfigError(f"{key}: {run.path} has no complete checkpoint (checkpoints/step<N> with its "
                          f"checkpoint.json). The run saves them with trainer.checkpoint_every=N; start it afresh "
                          f"without trainer.resume.")
    return str(newest[0].path)


def _differences(key: str, saved: Any, now: Any, shown: str | None = None) -> list[str]:
    """'<key> <saved> (now <now>)' for each leaf that differs (a model's or data's settings: the keys, not the whole
    mappings). ``shown``: the user's key of an entry of ``key``'s mapping, a template (tables.{}.optimizer)."""
    if isinstance(saved, dict) and isinstance(now, dict):
        names = sorted(set(saved) | set(now), key=str)
        return [d for k in names for d in _differences(shown.format(k) if shown else f"{key}.{k}", saved.get(k),
                                                       now.get(k))]
    return [] if saved == now else [f"{key} {saved} (now {now})"]


def check_resume(plan: LaunchPlan, given: str = "", model: ModelFacts | None = None) -> None:
    """trainer.resume_from must be a checkpoint dir a run wrote, saved from the same recipe, engine and layout, with
    every file as it was written, and (``model``: a user's model built on meta) holding every tensor of the model as
    its code builds it now. ``given``: the key the user gave when it was not trainer.resume_from (e.g.
    ``trainer.resume=latest``), which each refusal names."""
    if not plan.resume_from:
        return
    ckpt = CheckpointDir(plan.resume_from)
    key = f"{given} (its checkpoint {plan.resume_from})" if given else f"trainer.resume_from={plan.resume_from}"
    if not ckpt.meta.is_file():
        raise ConfigError(f"{key}: not a checkpoint dir (no {ckpt.meta.name} in it). Give one of a run's "
                          f"log_output/<run>/checkpoints/step<N> folders, or leave trainer.resume_from empty.")
    try:
        saved = json.loads(ckpt.meta.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigError(f"{key}: {ckpt.meta} cannot be read ({e}); the checkpoint is incomplete or damaged. "
                          f"Give another checkpoint dir.") from None
    if saved.get("step", 0) >= plan.steps:
        raise ConfigError(f"{key}: the checkpoint is at step {saved.get('step')} and trainer.steps={plan.steps}: "
                          f"nothing is left to train. Set trainer.steps above {saved.get('step')}.")
    now = checkpoint_layout(plan)
    saved["data"] = trained_data(saved.get("data"))  # saved before the loader's settings were left out
    diff = [d for k, v in now.items() if k in saved or k not in LATER_KEYS
            for d in _differences(k, saved.get(k), v, LATER_KEYS.get(k))]
    if diff:
        why = ("" if saved.get("format") == "dcp" else " DeepSpeed's checkpoint files hold each rank's own partitions, "
               "so they resume only on the layout (world size, dims, ZeRO stage) they were saved with.")
        raise ConfigError(f"{key}: saved with {', '.join(diff)}.{why} Resume with the settings it was saved with.")
    check_checkpoint_files(ckpt, saved, given or key)
    if model is not None and model.state is not None and saved.get("format") == "dcp":
        _check_model_keys(plan, ckpt, model.state, key)


def _check_model_keys(plan: LaunchPlan, ckpt: CheckpointDir, state: dict[str, tuple[int, ...]], key: str) -> None:
    """The tensors the parts' model holds (the tables and modules trained outside them are saved apart) against
    those the checkpoint's DCP metadata lists: a model whose code changed since is refused here, not by each rank."""
    import torch.distributed.checkpoint as dcp

    try:
        saved = dcp.FileSystemReader(str(ckpt.dcp)).read_metadata().state_dict_metadata
    except Exception:  # noqa: BLE001  (a checkpoint whose files are as written, but unreadable: its ranks say why)
        return
    apart = [t.name for t in plan.placement.tables if t.outside] + [m.name for m in plan.placement.modules]
    held = {k: v for k, v in state.items() if not any(k.startswith(p + ".") for p in apart)}
    missing = [k for k in held if f"model.{k}" not in saved]
    other = [f"{k} {held[k]} (saved {tuple(saved[f'model.{k}'].size)})" for k in held if f"model.{k}" in saved
             and hasattr(saved[f"model.{k}"], "size") and tuple(saved[f"model.{k}"].size) != held[k]]
    if not (missing or other):
        return
    words = ([f"the model now holds {few(missing, MAX_NAMED)}, which the checkpoint does not"] if missing else []) + \
            ([f"shapes differ: {few(other, MAX_NAMED)}"] if other else [])
    raise ConfigError(f"{key}: the model's code changed since the checkpoint was saved: {'; '.join(words)}. Resume "
                      f"with the model's code as it was when the checkpoint was written, or start afresh without "
                      f"{key.split('=')[0]}.")


MAX_NAMED = 5
"""A damaged checkpoint's message names at most this many files."""


def check_checkpoint_files(ckpt: CheckpointDir, saved: dict, key: str) -> None:
    """Every file of checkpoint.json's manifest (``files``) as it was written: a missing, truncated or changed one
    is a ConfigError naming it, and the fix names the newest earlier checkpoint of the run that is intact (a resume
    never falls back to it by itself)."""
    problems = checkpoint_damage(ckpt, saved)
    if not problems:
        return
    more = f"; and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else ""
    earlier = _earlier_intact(ckpt, int(saved.get("step", 0)))
    fix = (f"Resume from the newest earlier checkpoint that is intact, step {earlier[1]}: "
           f"trainer.resume_from={earlier[0].path}" if earlier else
           f"No earlier checkpoint of this run is intact: give another checkpoint, or start afresh without "
           f"{key.split('=')[0]}")
    raise ConfigError(f"{key}: the checkpoint {ckpt.path} is damaged: {'; '.join(problems[:MAX_NAMED])}{more}. Its "
                      f"ranks would fail reading it. {fix}.")


def checkpoint_damage(ckpt: CheckpointDir, saved: dict) -> list[str]:
    """One phrase per file of ``ckpt`` that is not as its checkpoint.json (``saved``) lists it; [] when intact. A
    checkpoint written before manifests (no ``files``): only its trainer.0.pt, which every one has, is looked for."""
    files = saved.get("files")
    if files is None:
        return [] if ckpt.trainer(0).is_file() else [f"{ckpt.trainer(0).name} is missing"]
    if not isinstance(files, dict):
        return [f"the file list (files) of its {ckpt.meta.name} is malformed"]
    return manifest_problems(ckpt.path, files)


def checkpoints_newest_first(run: RunDir, before: int | None = None):
    """(checkpoint, step, its damage: [] when every file is as written) of each complete checkpoint of ``run``
    (before step ``before``, when given), newest first; checked one at a time, as the caller asks for the next."""
    for ckpt, step in reversed(run.complete_checkpoints()):
        if before is not None and step >= before:
            continue
        try:
            saved = json.loads(ckpt.meta.read_text())
            damage = (checkpoint_damage(ckpt, saved) if isinstance(saved, dict)
                      else [f"its {ckpt.meta.name} is not a JSON object"])
        except (OSError, ValueError, RecursionError) as e:
            damage = [f"its {ckpt.meta.name} cannot be read ({e})"]
        yield ckpt, step, damage


def newest_intact_checkpoint(run_dir: RunDir, console: Console):
    """(checkpoint, step) a restart resumes from: the run's newest complete one whose files are as checkpoint.json
    lists them (a damaged one, e.g. cut short by a full disk, is skipped and said); None when there is none."""
    for ckpt, step, damage in checkpoints_newest_first(run_dir):
        if not damage:
            return ckpt, step
        console.print(f"[yellow]checkpoint {escape(str(ckpt.path))} is damaged ({escape('; '.join(damage[:3]))}): "
                      f"the restart does not resume from it[/yellow]", soft_wrap=True)
    return None


def _earlier_intact(ckpt: CheckpointDir, step: int) -> tuple[CheckpointDir, int] | None:
    """The newest complete checkpoint beside ``ckpt`` (its run's checkpoints/) from before ``step`` whose files
    are as written (each one checked, newest first, until one is)."""
    run = RunDir(ckpt.root.parent)
    return next(((other, s) for other, s, damage in checkpoints_newest_first(run, before=step) if not damage), None)


def _check_loss_arguments(cfg: DictConfig, recipe: str) -> None:
    """A built-in recipe's loss with arguments (``loss.label_smoothing=0.1``): they are its constructor's. Only then
    is the loss's module imported (a plain ``_target_`` costs a dry run no torch import)."""
    spec = OmegaConf.to_container(cfg.loss, resolve=True)
    if isinstance(spec, dict) and set(spec) - {"_target_"}:
        from launcher.facts.user_code import check_target

        _, problems = check_target("loss", spec, f"recipe {recipe}")
        if problems:
            raise ConfigError(problems)
        from hydra.utils import instantiate

        try:  # torch's losses keep reduction (also what reduce=False sets): none is one value per sample
            with warnings.catch_warnings():  # torch's deprecation of reduce= / size_average=: the message says it
                warnings.simplefilter("ignore")
                reduction = getattr(instantiate(spec, _convert_="all"), "reduction", None)
        except Exception as e:  # noqa: BLE001 - the constructor's own check of a value
            raise ConfigError(f"loss (recipe {recipe}): building {spec['_target_']} failed: "
                              f"{type(e.__cause__ or e).__name__}: {first_line(e.__cause__ or e)}.") from None
        if isinstance(reduction, str) and reduction not in ("mean", "sum"):
            given = " ".join(f"loss.{k}={v}" for k, v in spec.items() if k != "_target_")
            legacy = " and ".join(f"loss.{k}" for k in ("reduce", "size_average") if k in spec)
            fix = f"Drop {legacy} (torch's deprecated form) and set" if legacy else "Set"
            raise ConfigError(f"{given} (recipe {recipe}): {spec['_target_']} would return one value per sample "
                              f"(reduction {reduction}); the loss must return a scalar (one number, which backward() "
                              f"and the logged loss take). {fix} loss.reduction=mean.")


def gather_facts(cfg: DictConfig, config_dir: str | None = None, estimate: bool = True) -> Facts:
    """The facts the plan takes besides the host: the launch backends and the parts' rules (what each can run and
    costs, so that the plan imports none), the recipe cfg.recipe.name names, and its facts (_recipe_facts)."""
    from launcher.parallel import RULES
    from launcher.usercode import recipe_for

    recipe = recipe_for(cfg.recipe.name)
    return dataclasses.replace(_recipe_facts(cfg, recipe, config_dir, estimate), backends=tuple(BACKENDS.values()),
                               parts=RULES, recipe=recipe)


def _recipe_facts(cfg: DictConfig, recipe: Any, config_dir: str | None, estimate: bool) -> Facts:
    """The facts of ``recipe`` (cfg.recipe.name's) before planning. A built-in recipe: its data_facts hook (which may
    read the user's files and raise ConfigError). A recipe in the user's folder: its folder made importable, then
    every check of ``launcher.facts.user_code`` (imports, arguments, dataset items, the model on the meta device, the
    loss)."""
    if not getattr(recipe, "from_folder", False):
        if cfg.eval_data is not None:
            raise ConfigError(f"eval_data is for recipes in your own folder; recipe {recipe.name} brings its own "
                              f"held-out data. Remove eval_data (see eval.batches).")
        if cfg.val_data is not None:
            raise ConfigError(f"val_data is for recipes in your own folder; recipe {recipe.name} brings its own data "
                              f"(data=tabular: data.val_fraction holds out a validation split). Remove val_data.")
        _check_loss_arguments(cfg, recipe.name)
        check_names(cfg, recipe.name)
        data = recipe.data_facts(OmegaConf.to_object(cfg.data))
        check_replaced(cfg, recipe, data)
        _check_sync_batchnorm(cfg, lambda: recipe.model_spec(OmegaConf.to_object(cfg.model), data),
                              f"recipe {recipe.name}")
        model = _layers(recipe, cfg, data) if cfg.parallel.pipeline_stages > 1 else None
        if not (wants_activations(cfg) and estimate):
            return Facts(data=data, model=model, lookups=_lookups(recipe, cfg, data))
        trace = _activations(recipe, cfg, data)
        return Facts(data=data, model=model, activations=trace and trace.layers, lookups=trace and trace.lookups,
                     families=trace.families if trace else ())
    from launcher.facts.user_code import inspect_user_recipe

    paths = [str(Path.cwd())]
    if config_dir is not None:
        paths.insert(0, str(Path(config_dir).resolve().parent))
    code_paths = tuple(dict.fromkeys(paths))
    for p in reversed(code_paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    source = f"{config_dir or 'conf'}/recipe/{recipe.name}.yaml"
    data, model, trace, imports = inspect_user_recipe(cfg, source, trace_activations=wants_activations(cfg))
    _check_sync_batchnorm(cfg, lambda: OmegaConf.to_container(cfg.model, resolve=True), f"model in {source}")
    return Facts(data=data, model=model, code_paths=code_paths, activations=trace and trace.layers,
                 lookups=trace and trace.lookups, families=trace.families if trace else (), imports=imports)


def _check_sync_batchnorm(cfg: DictConfig, spec: Any, source: str) -> None:
    """parallel.sync_batchnorm=true on a model with no BatchNorm would do nothing: refused (the model's ``spec()``
    built on the meta device)."""
    if not cfg.parallel.sync_batchnorm:
        return
    import torch
    from hydra.utils import instantiate
    from torch.nn.modules.batchnorm import _BatchNorm

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = instantiate(spec(), _convert_="all")
    except Exception:  # noqa: BLE001 - a model that cannot be built: the recipe's own checks name why
        return
    if not any(isinstance(m, _BatchNorm) for m in model.modules()):
        raise ConfigError(f"parallel.sync_batchnorm=true: the model ({source}) has no BatchNorm "
                          f"(BatchNorm1d/2d/3d) whose statistics could be synced, so it would do nothing. Set "
                          f"parallel.sync_batchnorm=false.")


def wants_activations(cfg: DictConfig) -> bool:
    """Whether the plan needs the per-layer activation trace (``Facts.activations``): a run that recomputes or has
    pipeline stages shows the estimate, and with placement.mode=auto the planner chooses the recompute set and
    predicts each device's memory from it. Other runs skip it: it imports torch, which their dry run never does."""
    return bool(cfg.recompute) or cfg.parallel.pipeline_stages > 1 or cfg.placement.get("mode") == "auto"


def _lookups(recipe, cfg: DictConfig, data) -> dict[str, float] | None:
    """Rows each sample looks up per table from a built-in recipe's optional torch-free ``lookups(model)`` hook (when
    no trace runs); None without one."""
    if not hasattr(recipe, "lookups"):
        return None
    return recipe.lookups(recipe.model_spec(OmegaConf.to_object(cfg.model), data))


def _layers(recipe, cfg: DictConfig, data) -> ModelFacts:
    """A built-in recipe's model facts with each layer's parameters and the weights layers share, counted on the
    meta device (a pipeline is planned from them; imports torch, also for ``check``)."""
    from launcher.facts.layer_sizes import layer_facts

    spec = recipe.model_spec(OmegaConf.to_object(cfg.model), data)
    facts = model_facts(recipe, spec)
    try:
        with warnings.catch_warnings():  # torch's warnings about odd sizes: the recipe's checks name the size
            warnings.simplefilter("ignore")
            layer_params, tied, paths = layer_facts(recipe, spec)
    except Exception:  # noqa: BLE001 - a model that cannot be built (e.g. a zero width): the recipe's checks name it
        return facts
    return dataclasses.replace(facts, layer_params=layer_params, tied=tied, layer_paths=paths)


def _activations(recipe, cfg: DictConfig, data):
    """The activation bytes of a built-in recipe's layers(), from its model on the meta device and one 2-sample
    batch of its data (imports torch: only where wants_activations, and not for ``check``)."""
    from hydra.utils import instantiate

    from launcher.facts.activations import activation_facts

    spec = recipe.model_spec(OmegaConf.to_object(cfg.model), data)
    try:
        source = instantiate(OmegaConf.to_container(cfg.data, resolve=True))
        batch = next(iter(source.train_batches(0, 1, 2, cfg.trainer.seed)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return activation_facts(recipe, spec, batch)
    except Exception:  # noqa: BLE001 - bad sizes the recipe's checks name; the plan then shows no estimate
        return None
