"""Preflight of a user recipe, in the launcher before any rank starts: import the named classes, check their
arguments against their signatures, read a few dataset items, build the model on the ``meta`` device (no memory)
to find its tables, size and layers, and run one tiny meta batch through the model and the loss. Every problem is
reported at once (ConfigError: exit 2), naming the YAML file and the key."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from launcher.contract import DataFacts, ModelFacts
from launcher.errors import ConfigError, first_line
from launcher.inspect.model import model_facts_on_meta
from launcher.usercode.pipeline_check import check_pipeline
from launcher.usercode.items import call, describe_output, input_tensors, map_inputs, select_output, split_item

HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")
"""Keys of a _target_ spec that are Hydra's, not the constructor's arguments."""

CPU_CHECK_PARAMS = 50_000_000
"""A model whose forward cannot run on the meta device (a data-dependent branch: HuggingFace's masks) is checked on
the CPU, built for real, when it has at most this many parameters; a larger one is checked by its first step."""

LABEL_SCAN = 256
"""Dataset items read to decide whether the labels are binary (eval.metrics=auto)."""


def _first_line(e: BaseException) -> str:
    """``Type: first line`` of an exception (errors.first_line with the exception's type in front)."""
    return f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__


def locate(path: str) -> Any:
    """The object at a dotted path (``pkg.module.Class``); raises ImportError/AttributeError as Python would."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name and ".".join(parts[:cut]).startswith(e.name):
                continue  # a shorter prefix may be the module
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    return importlib.import_module(path)


def check_target(key: str, spec: Mapping[str, Any] | None, source: str) -> tuple[Any, list[str]]:
    """(the class, problems) for ``spec``'s ``_target_``: it imports, and its constructor takes the spec's keys."""
    where = f"{key} in {source}"
    if not isinstance(spec, Mapping) or "_target_" not in spec:
        return None, [f"{key} ({source}) needs a _target_: the dotted path of a class, e.g. "
                      f"{key}: {{_target_: my_project.model.Net, ...}}."]
    target = spec["_target_"]
    try:
        cls = locate(target)
    except Exception as e:  # noqa: BLE001 (the user's module may raise anything on import)
        return None, [f"{key}._target_={target} ({where}) does not import: {_first_line(e)}. Check the dotted path "
                      f"and that its package is in the folder you run from (or next to --config-dir)."]
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return cls, []
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return cls, []
    given = [k for k in spec if k not in HYDRA_KEYS]
    problems = []
    for k in given:
        if k not in params:
            close = difflib.get_close_matches(k, [*params, *HYDRA_KEYS], n=1)
            hint = f" Did you mean {key}.{close[0]}?" if close else ""
            problems.append(f"{key}.{k}={spec[k]!r} ({where}): {target}() has no argument {k}.{hint} "
                            f"Its arguments: {', '.join(params) or 'none'}.")
        elif _wrong_number(params[k], spec[k]):
            kind = _annotation_name(params[k])
            default = params[k].default
            example = default if not _wrong_number(params[k], default) and default is not None else {
                "int": 1, "float": 0.1}[kind]
            problems.append(f"{key}.{k}={spec[k]!r} ({where}): {target}() takes {'an' if kind == 'int' else 'a'} "
                            f"{kind} for {k}, not a {type(spec[k]).__name__}. Give "
                            f"{'an integer' if kind == 'int' else 'a number'}, e.g. {key}.{k}={example}.")
    for name, p in params.items():
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in given:
            problems.append(f"{key}.{name} ({where}) is required by {target}() and not set. Set {key}.{name}=<value>.")
    return cls, problems


def _annotation_name(p: inspect.Parameter) -> str:
    """'int' or 'float' when the parameter is annotated as exactly that (a class or, under ``from __future__ import
    annotations``, its name); else ''."""
    ann = p.annotation
    name = ann if isinstance(ann, str) else getattr(ann, "__name__", "") if ann in (int, float) else ""
    return name if name in ("int", "float") else ""


def _wrong_number(p: inspect.Parameter, value: Any) -> bool:
    """A value that is no number for a parameter annotated int or float (``label_smoothing: float`` given 'abc'), which
    many constructors store unchecked and the first step then fails on; an int annotation also refuses 1.5."""
    kind = _annotation_name(p)
    if not kind or value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return kind == "int" and not isinstance(value, int)


def _item_problem(item: Any, keys: tuple[tuple[str, ...], str]) -> str:
    """Why ``item`` is not one the ranks can batch and split ('' when it is): a tuple/list of at least an input and
    a label, or a dict with a label key, of what default_collate batches."""
    from torch.utils.data import default_collate

    if not isinstance(item, (tuple, list, Mapping)) or (not isinstance(item, Mapping) and len(item) < 2):
        got = type(item).__name__ if not isinstance(item, (tuple, list)) else f"a {len(item)}-element {type(item).__name__}"
        return (f"is {got}; an item is (input_1, ..., input_k, label) or a dict of inputs and a label "
                f"({{'input_ids': ..., 'labels': ...}}), of tensors, numbers or numpy arrays")
    try:
        split_item(default_collate([item]), *keys)
    except KeyError as e:
        missing = [k for k in keys[0] if k not in item]
        what = f"has no key {', '.join(missing)} (data_inputs)" if missing else f"has {e.args[0]}"
        return f"{what}. Set data_label (and data_inputs) to its keys: {', '.join(map(str, item))}"
    except TypeError as e:
        return f"does not batch with DataLoader's default_collate: {_first_line(e)}"
    return ""


def dataset_facts(key: str, spec: Mapping[str, Any], source: str,
                  keys: tuple[tuple[str, ...], str] = ((), "")) -> tuple[Any, list[str]]:
    """(the built dataset, problems): it builds, has a length, and its items batch and split (_item_problem)."""
    try:
        ds = instantiate(spec, _convert_="all")
    except Exception as e:  # noqa: BLE001
        return None, [f"{key} ({source}): building {spec['_target_']} failed: {_first_line(e.__cause__ or e)}."]
    try:
        n = len(ds)
        item = ds[0] if n else None
    except Exception as e:  # noqa: BLE001
        return None, [f"{key} ({source}): {spec['_target_']} is not a map-style Dataset (len() and [i]): "
                      f"{_first_line(e)}. Give a torch.utils.data.Dataset with __len__ and __getitem__."]
    if n == 0:
        return None, [f"{key} ({source}): {spec['_target_']} has no items. Give a non-empty dataset."]
    why = _item_problem(item, keys)
    if why:
        return None, [f"{key} ({source}): item 0 of {spec['_target_']} {why}."]
    return ds, []


def _two_items(dataset: Any, keys: tuple[tuple[str, ...], str]) -> tuple[Any, Any]:
    """The dataset's first two items batched as the ranks' DataLoader does: (inputs, label)."""
    from torch.utils.data import default_collate

    return split_item(default_collate([dataset[i] for i in range(min(2, len(dataset)))]), *keys)


def _labels(dataset: Any, keys: tuple[tuple[str, ...], str], count: int) -> list:
    """The labels of the first ``count`` items, each batched alone as the ranks' DataLoader batches it."""
    from torch.utils.data import default_collate

    return [split_item(default_collate([dataset[i]]), *keys)[1] for i in range(min(count, len(dataset)))]


def check_model_and_loss(model: nn.Module, loss_fn: Any, batch: tuple[Any, Any], source: str,
                         model_output: str = "auto", device: str = "meta") -> tuple[list[str], bool, str]:
    """One micro-batch of two items, on the model's device (meta: no memory): the model takes the inputs, the loss
    takes what ``model_output`` selects of its output and the label. Returns (problems, whether the output has one
    score per label element: what binary metrics need, a line saying what the loss takes; all empty when the model
    cannot run on meta)."""
    inputs, label = map_inputs(batch[0], lambda t: t.to(device)), batch[1].to(device)
    try:
        with torch.no_grad():
            out = call(model, inputs)
    except NotImplementedError:
        return [], False, ""
    except Exception as e:  # noqa: BLE001
        if "meta" in str(e).lower():
            return [], False, ""
        if isinstance(inputs, Mapping):
            shapes, how = ", ".join(f"{k}={tuple(v.shape)}" for k, v in inputs.items()), "model(**inputs)"
        else:
            shapes, how = ", ".join(str(tuple(t.shape)) for t in inputs), "model(input_1, ..., input_k)"
        return [f"model ({source}): its forward fails on a batch of 2 dataset items (inputs {shapes}): "
                f"{_first_line(e)}. The model is called as {how} with every item's inputs (all but the label), "
                f"batched."], False, ""
    try:
        picked = select_output(out, model_output)
    except (KeyError, IndexError, AttributeError) as e:
        return [f"model_output={model_output}: the model's output ({type(out).__name__}) has no {e}. Set "
                f"model_output to one of its keys or attributes, or auto."], False, ""
    if not torch.is_tensor(picked):
        fields = f" (its keys: {', '.join(out)})" if isinstance(out, Mapping) else ""
        return [f"model_output={model_output}: the loss would get a {type(picked).__name__} of the model's "
                f"{type(out).__name__}{fields}, not a tensor. Set model_output to the key or attribute path of the "
                f"tensor the loss takes (e.g. model_output=logits)."], False, ""
    line = describe_output(out, model_output)
    out = picked
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # e.g. MSELoss broadcasting a target of another size
            value = loss_fn(out, label)
    except Exception as e:  # noqa: BLE001
        if "meta" in str(e).lower() and "size" not in str(e).lower():
            return [], False, line
        return [f"loss ({source}): {type(loss_fn).__name__} rejects the model's output {tuple(out.shape)} "
                f"{str(out.dtype).removeprefix('torch.')} against the label {tuple(label.shape)} "
                f"{str(label.dtype).removeprefix('torch.')}: {_first_line(e)}. Make the model's output and the "
                f"dataset's label the shapes and dtypes the loss expects."], False, line
    problem = scalar_loss_problem(value, loss_fn, f"loss ({source})")
    if problem:
        return [problem], False, line
    return [], out.numel() == label.numel(), line


def scalar_loss_problem(value: Any, loss_fn: Any, where: str) -> str:
    """'' when the loss returned one number (a tensor of one element) for the batch; else the problem: backward()
    and the logged loss need a scalar, not one value per sample (``reduction: none``)."""
    if torch.is_tensor(value) and value.numel() == 1:
        return ""
    got = f"a tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else f"a {type(value).__name__}"
    reduction = getattr(loss_fn, "reduction", None)
    fix = (f"Set loss.reduction=mean (it is {reduction}: one value per sample)" if isinstance(reduction, str)
           and reduction not in ("mean", "sum") else "Make the loss return one number for the batch (e.g. its "
           "values' .mean()), or set its reduction to mean")
    return (f"{where}: {type(loss_fn).__name__} returns {got} on a batch of 2 dataset items; the loss must return a "
            f"scalar (one number, which backward() and the logged loss take). {fix}.")


def inspect_user_recipe(cfg: DictConfig, source: str,
                        trace_activations: bool = False) -> tuple[DataFacts, ModelFacts, Any]:
    """Every check of a user recipe, then its facts; ConfigError listing all problems. ``trace_activations``: also
    the per-layer activation bytes of one meta forward and the rows each table looks up per sample
    (launcher/inspect/activations.py Trace; None otherwise), which the caller asks for when the plan needs them (launcher.launch.preflight.wants_activations)."""
    model_spec = OmegaConf.to_container(cfg.model, resolve=True)
    data_spec = OmegaConf.to_container(cfg.data, resolve=True)
    eval_spec = OmegaConf.to_container(cfg.eval_data, resolve=True) if cfg.eval_data is not None else None
    loss_spec = OmegaConf.to_container(cfg.loss, resolve=True)
    keys = (tuple(cfg.data_inputs), cfg.data_label)
    problems: list[str] = []
    checked = {}
    for key, spec in (("model", model_spec), ("data", data_spec), ("eval_data", eval_spec), ("loss", loss_spec)):
        if spec is None:
            continue
        cls, found = check_target(key, spec, source)
        problems += found
        checked[key] = cls is not None and not found
    train = evaluation = model = loss_fn = None
    if checked.get("data"):
        train, found = dataset_facts("data", data_spec, source, keys)
        problems += found
    if checked.get("eval_data"):
        evaluation, found = dataset_facts("eval_data", eval_spec, source, keys)
        problems += found
    if checked.get("model"):
        try:
            with torch.device("meta"):
                model = instantiate(model_spec, _convert_="all")
        except Exception as e:  # noqa: BLE001
            problems.append(f"model ({source}): building {model_spec['_target_']} on the meta device failed: "
                            f"{_first_line(e.__cause__ or e)}.")
        if model is not None and not isinstance(model, nn.Module):
            problems.append(f"model._target_={model_spec['_target_']} ({source}) built a {type(model).__name__}, "
                            f"not a torch.nn.Module.")
            model = None
    if checked.get("loss"):
        try:
            loss_fn = instantiate(loss_spec, _convert_="all")
        except Exception as e:  # noqa: BLE001
            problems.append(f"loss ({source}): building {loss_spec['_target_']} failed: {_first_line(e.__cause__ or e)}.")
    scores, batch, output_line = False, None, ""
    if train is not None:
        try:
            batch = _two_items(train, keys)
        except Exception as e:  # noqa: BLE001
            problems.append(f"data ({source}): items 0 and 1 do not batch together: {_first_line(e)}. Every item "
                            f"needs the same number of tensors, each of the same shape in every item.")
    if model is not None and loss_fn is not None and batch is not None:
        found, scores, output_line = check_model_and_loss(model, loss_fn, batch, source, cfg.model_output)
        if not (found or output_line) and sum(p.numel() for p in model.parameters()) <= CPU_CHECK_PARAMS:
            found, scores, output_line = check_model_and_loss(instantiate(model_spec, _convert_="all"), loss_fn,
                                                              batch, source, cfg.model_output, device="cpu")
        problems += found
        if cfg.parallel.pipeline_stages > 1 and not found:
            found, split, order = check_pipeline(model_spec, model, batch, source, cfg.parallel.pipeline_stages,
                                                 cfg.model_output)
            problems += found
    labels = []
    if train is not None:
        try:
            labels = _labels(train, keys, LABEL_SCAN)
        except Exception as e:  # noqa: BLE001
            problems.append(f"data ({source}): reading and batching its first {LABEL_SCAN} items failed: "
                            f"{_first_line(e)}. Every item needs the same structure (the same keys or number of "
                            f"elements).")
    if problems:
        raise ConfigError(problems)
    facts = model_facts_on_meta(model)
    if cfg.parallel.pipeline_stages > 1:
        facts = dataclasses.replace(facts, layers=order, split=split)
    # Binary metrics (AUC, accuracy) when each label element is a 0/1 float with one score from the model: a
    # BCE-style model. Integer class labels (CrossEntropyLoss) keep the loss only.
    binary = scores and all(y.is_floating_point() and bool(((y == 0) | (y == 1)).all()) for y in labels)
    n_eval = len(evaluation) if evaluation is not None else 0
    inputs = (f"keyword inputs {', '.join(batch[0])}" if isinstance(batch[0], Mapping) else
              f"{len(batch[0])} input(s)")
    line = (f"data: {data_spec['_target_']}: {len(train):,} items of {inputs} + label"
            f"{', binary labels' if binary else ''}; eval_data: "
            f"{f'{n_eval:,} items' if evaluation is not None else 'none (no evaluation)'}")
    activations = None
    if trace_activations:
        from launcher.inspect.activations import activation_facts
        from launcher.usercode.recipe import UserRecipe

        activations = activation_facts(UserRecipe(cfg.recipe.name), model_spec, batch)
    data = DataFacts(train_samples=len(train), lines=(line, output_line) if output_line else (line,),
                     binary_labels=binary, eval_samples=n_eval)
    return data, facts, activations
