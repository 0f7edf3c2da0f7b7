"""Preflight of a user recipe, in the launcher before any rank starts: import the named classes, check their
arguments against their signatures, read a few dataset items, build the model on the ``meta`` device (no memory)
to find its tables, size and layers, and run one tiny meta batch through the model and the loss. Every problem is
reported at once (ConfigError: exit 2), naming the YAML file and the key."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from launcher.contract import DataFacts, ModelFacts
from launcher.errors import ConfigError, did_you_mean, few, first_words
from launcher.facts.model import dtype_problems, gradient_facts, meta_model, model_facts_on_meta, state_shapes
from launcher.plain import to_plain
from launcher.procfs import kernel_field
from launcher.plan.placement import takes_tables_out
from launcher.plan.table_keys import resolve_aliases
from launcher.usercode.data_check import Sample, dataset_facts, item_labels, one_item, two_items
from launcher.usercode.forward_check import CPU_CHECK_PARAMS, Swap, check_model_and_loss, cpu_model, swap_tables
from launcher.facts.pipeline_cut import check_pipeline, with_outside
from launcher.usercode.targets import (HYDRA_KEYS, SPEC_SECTIONS, build_collate, import_targets, locate,
                                       spec_shape_problems)

LABEL_SCAN = 256
"""Dataset items read to decide whether the labels are binary (eval.metrics=auto)."""
COUNT_MAX = 1 << 16
"""The most items of a stream the launcher counts (keeping only the first LABEL_SCAN): see _group_reach."""

def check_target(key: str, spec: Mapping[str, Any] | None, source: str) -> tuple[Any, list[str]]:
    """(the class, problems) for ``spec``'s ``_target_``: a spec's shape (spec_shape_problems), then it imports, and
    its constructor takes the spec's keys."""
    where = f"{key} in {source}"
    shape = spec_shape_problems({key: spec}, source)
    if shape or spec is None:
        return None, shape
    target = spec["_target_"]
    failed = import_targets(spec, key)  # nested ones too: a package's import-time code never runs on meta
    if failed:
        return None, [f"{k}._target_={t} ({where}) does not import: {first_words(e)}. Check the dotted path "
                      f"and that its package is in the folder you run from (or next to --config-dir)."
                      for k, t, e in failed]
    cls = locate(target)
    if inspect.ismodule(cls):
        found = [n for n, v in vars(cls).items() if inspect.isclass(v) and v.__module__ == cls.__name__]
        return None, [f"{key}._target_={target} ({where}) is a module, not a class or function: give the one in it "
                      f"to build, e.g. {key}._target_={target}.{found[0] if found else '<Class>'}."]
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
            hint = did_you_mean(k, [*params, *HYDRA_KEYS], f"{key}.")
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
    required = [name for name, p in params.items()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in given]
    if key == "loss":
        required, loss_problem = _loss_call(spec, cls, params, required, where)
        problems += loss_problem
    problems += [f"{key}.{name} ({where}) is required by {target}() and not set. Set {key}.{name}=<value>."
                 for name in required]
    return cls, problems


LOSS_CALL = 2
"""The worker calls the loss it built as loss(output, label)."""


def _loss_call(spec: Mapping[str, Any], cls: Any, params: Mapping[str, inspect.Parameter], required: list[str],
               where: str) -> tuple[list[str], list[str]]:
    """(the required arguments left for the config to set, problems) of a loss: a class is built from the config's
    keys; a function is taken as Hydra's partial (``_partial_: true``), whose first two positional arguments are
    the output and the label of each call (torch.nn.functional.binary_cross_entropy_with_logits(input, target))."""
    if inspect.isclass(cls):
        return required, []
    target = spec["_target_"]
    if not spec.get("_partial_"):
        return [], [f"loss._target_={target} ({where}) is a function, not a class: the worker builds the loss once "
                    f"and calls it as loss(output, label) each step. Set loss._partial_=true (Hydra's partial: the "
                    f"keys given are bound, the output and label come with each call), or name a class such as "
                    f"torch.nn.BCEWithLogitsLoss."]
    positional = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and n not in spec][:LOSS_CALL]
    if len(positional) < LOSS_CALL and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return [], [f"loss._target_={target} ({where}) with _partial_: true is called as loss(output, label), and "
                    f"{target}() leaves {len(positional)} positional argument(s) for them "
                    f"({', '.join(positional) or 'none'}). Name a loss that takes (output, label), or a class."]
    return [n for n in required if n not in positional], []


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


def inspect_user_recipe(cfg: DictConfig, source: str,
                        trace_activations: bool = False) -> tuple[DataFacts, ModelFacts, Any, tuple[int, str]]:
    """Every check of a user recipe, then its facts; ConfigError listing all problems. ``trace_activations``: also
    the per-layer activation bytes of one meta forward and the rows each table looks up per sample
    (launcher/facts/activations.py Trace; None otherwise), which the caller asks for when the plan needs them
    (launcher.facts.preflight.wants_activations). Last, (bytes, what): the resident memory importing the recipe's
    packages added (Facts.imports)."""
    before = kernel_field("/proc/self/status", "VmRSS")
    sections = {key: cfg[key] for key in SPEC_SECTIONS}
    problems = spec_shape_problems(sections, source)
    if problems:
        raise ConfigError(problems)
    specs = {key: OmegaConf.to_container(node, resolve=True) for key, node in sections.items() if node is not None}
    checked = {}
    for key, spec in specs.items():
        cls, found = check_target(key, spec, source)
        problems += found
        checked[key] = cls is not None and not found
    collate, collate_problems = _collate(cfg, source)
    problems += collate_problems
    imports = (max(0, kernel_field("/proc/self/status", "VmRSS") - before), _packages(specs, cfg))
    keys = (tuple(cfg.data_inputs), cfg.data_label)
    data, samples = {}, {}
    for key in ("data", "eval_data", "val_data"):
        if checked.get(key) and not collate_problems:  # the train data's first LABEL_SCAN items, read once
            data[key], samples[key], more = dataset_facts(key, specs[key], source, keys, collate,
                                                          *((LABEL_SCAN, _group_reach(cfg)) if key == "data" else (1,)))
            problems += more
    model, more = meta_model(specs["model"], source) if checked.get("model") else (None, [])
    problems += more + (dtype_problems(model, cfg.precision, source) if model is not None else [])
    loss_fn, more = _loss(specs["loss"], source) if checked.get("loss") else (None, [])
    problems += more
    batch, labels, more = _first_batches(samples.get("data"), keys, collate, source)
    problems += more
    facts = model_facts_on_meta(model) if model is not None else None
    if facts is not None:
        facts = dataclasses.replace(facts, state=state_shapes(model))
    scores, output_line = False, ""
    if facts is not None and loss_fn is not None and batch is not None:
        found, scores, output_line = forward_checks(specs["model"], facts, _swap(cfg, facts), loss_fn, batch, source,
                                                    cfg.model_output)
        problems += found
        if not found:
            found, facts = gradient_facts(model, facts, loss_fn, batch, source, cfg.model_output)
            problems += found
        if not found:  # what a micro-batch of one item does (BatchNorm training on one value, a squeeze())
            alone = one_item(samples["data"].items, keys, collate)
            single = forward_checks(specs["model"], facts, _swap(cfg, facts), loss_fn, alone, source,
                                    cfg.model_output, items=1)[0]
            facts = dataclasses.replace(facts, single_item=single[0] if single else "")
        if cfg.parallel.pipeline_stages > 1 and not found:
            found, split, order, barred = check_pipeline(specs["model"], model, batch, source, cfg.parallel,
                                                         cfg.model_output, facts, cfg.precision)
            problems += found
            params = facts.layer_params and with_outside(model, batch, order, facts.layer_params)
            facts = dataclasses.replace(facts, layers=order, split=split, uncuttable=barred, layer_params=params)
    if problems:
        raise ConfigError(problems)
    problems += _val_problems(data.get("val_data"))
    if problems:
        raise ConfigError(problems)
    data_facts = _data_facts(specs["data"], data["data"], samples["data"], data.get("eval_data"), batch, labels,
                             scores, output_line, data.get("val_data"))
    activations = None
    if trace_activations:
        from launcher.facts.activations import activation_facts
        from launcher.usercode.recipe import UserRecipe

        activations = activation_facts(UserRecipe(cfg.recipe.name), specs["model"], batch)
    return data_facts, facts, activations, imports


def _packages(specs: dict[str, Any], cfg: DictConfig) -> str:
    """The top-level packages the recipe's _target_s (nested ones too) and loader.collate_fn name: 'torchrec,
    my_ctr'."""
    from launcher.usercode.targets import nested_targets

    named = [t for key, spec in specs.items() for _, t in [(key, spec.get("_target_", ""))] + nested_targets(spec, key)]
    collate = OmegaConf.to_container(cfg.loader, resolve=True)["collate_fn"]
    named.append(collate.get("_target_", "") if isinstance(collate, Mapping) else collate or "")
    return ", ".join(dict.fromkeys(t.split(".")[0] for t in named if isinstance(t, str) and t)) or "-"


def _collate(cfg: DictConfig, source: str) -> tuple[Any, list[str]]:
    """(loader.collate_fn built, problems)."""
    spec = OmegaConf.to_container(cfg.loader, resolve=True)["collate_fn"]
    try:
        return build_collate(spec), []
    except Exception as e:  # noqa: BLE001 (the user's code may raise anything)
        shown = spec.get("_target_") if isinstance(spec, Mapping) else spec
        return None, [f"loader.collate_fn={shown} ({source}): {first_words(e.__cause__ or e)}. Give a function by its "
                      f"dotted path (loader.collate_fn=my_project.data.collate), or {{_target_: ..., ...}} with its "
                      f"arguments."]


def _loss(spec: dict[str, Any], source: str) -> tuple[Any, list[str]]:
    try:
        return instantiate(spec, _convert_="all"), []
    except Exception as e:  # noqa: BLE001
        return None, [f"loss ({source}): building {spec['_target_']} failed: {first_words(e.__cause__ or e)}."]


def _first_batches(sample: Sample | None, keys: tuple[tuple[str, ...], str], collate: Any,
                   source: str) -> tuple[Any, list, list[str]]:
    """(a batch of the first two items, the labels of the first LABEL_SCAN items, problems)."""
    if sample is None:
        return None, [], []
    try:
        batch = two_items(sample.items, keys, collate)
    except Exception as e:  # noqa: BLE001
        return None, [], [f"data ({source}): items 0 and 1 do not batch together: {first_words(e)}. Every item "
                          f"needs the same number of tensors, each of the same shape in every item (or a "
                          f"loader.collate_fn that batches them)."]
    try:
        return batch, item_labels(sample.items, keys, collate), []
    except Exception as e:  # noqa: BLE001
        return batch, [], [f"data ({source}): reading and batching its first {LABEL_SCAN} items failed: "
                           f"{first_words(e)}. Every item needs the same structure (the same keys or number of "
                           f"elements)."]


def _swap(cfg: DictConfig, facts: ModelFacts) -> Swap | None:
    """The tables the check swaps for lookups, with the id hash of those that hash, as the config asks (the plan
    checks the keys themselves): those the run takes out of the parts (Swap.planned), or, when it trains them inside
    as written, every movable one for the check alone (their ids are then checked against their rows too)."""
    pl = cfg.placement
    aliases = dict(facts.aliases)
    table_cfgs, _ = resolve_aliases("tables", to_plain(cfg.tables, resolve=True), aliases)
    wanted, _ = resolve_aliases("placement.tables", to_plain(pl.tables, resolve=True), aliases)
    planned = takes_tables_out(pl.host_device_mix, wanted, table_cfgs, pl.ps) or pl.mode == "auto"
    shapes = {n: s for n, s in facts.tables.items() if (table_cfgs.get(n) or {}).get("optimizer") != "dense"}
    hashing = {}
    for name, (rows, _) in shapes.items():
        buckets, fn = (table_cfgs.get(name) or {}).get("hash", 0), (table_cfgs.get(name) or {}).get("hash_fn", "mix")
        if buckets:  # a hash the plan refuses (too many rows, a bad function) still maps the ids into the table here
            ok = isinstance(buckets, int) and not isinstance(buckets, bool) and 2 <= buckets <= rows
            hashing[name] = (buckets if ok else rows, fn if fn in ("mix", "mod") else "mix")
    return Swap(shapes, hashing, {path: name for name, path in aliases.items()}, planned) if shapes else None


def forward_checks(spec: dict[str, Any], facts: ModelFacts, swap: Swap | None, loss_fn: Any, batch: Any, source: str,
                   output: str, items: int = 2) -> tuple[list[str], bool, str]:
    """check_model_and_loss as the ranks will run the model. With tables to swap and a small dense part, on the CPU
    with the tables swapped for lookups and never made (the ids checked against the tables' rows too); a failure
    other than the ids' is then, when the run trains the tables inside as written (not Swap.planned), checked again
    on the model as written. Otherwise on meta (tables swapped when planned), then on the CPU when meta cannot run
    it and the model is small."""
    def build() -> nn.Module:
        return instantiate(spec, _convert_="all")

    total = facts.dense_params + sum(r * d for r, d in facts.tables.values())
    found, scores, line = [], False, ""
    cpu_swapped = swap is not None and not facts.kept and facts.dense_params <= CPU_CHECK_PARAMS
    if cpu_swapped:
        found, scores, line = check_model_and_loss(cpu_model(build, total, facts.dense_params, swap, False), loss_fn,
                                                   batch, source, output, device="cpu", items=items)
        if swap.planned or not found or found[0].startswith(f"data ({source})"):
            return _blamed(found, swap, build, loss_fn, batch, source, output), scores, line
    planned = swap if swap is not None and swap.planned else None
    with torch.device("meta"):
        meta = build()
    if planned is not None:
        swap_tables(meta, planned, "meta")
    found, scores, line = check_model_and_loss(meta, loss_fn, batch, source, output, items=items)
    if not (found or line):  # it cannot run on meta
        cpu = cpu_model(build, total, facts.dense_params, planned, bool(facts.kept))
        if cpu is not None:
            found, scores, line = check_model_and_loss(cpu, loss_fn, batch, source, output, device="cpu", items=items)
    return _blamed(found, planned, build, loss_fn, batch, source, output), scores, line


def _blamed(found: list[str], swap: Swap | None, build, loss_fn: Any, batch: Any, source: str,
            output: str) -> list[str]:
    """``found``, where a forward that failed with the run's tables swapped runs as written on meta: the problem
    says the swap makes it fail."""
    if swap is None or not swap.planned or not found or not found[0].startswith(f"model ({source}): its forward"):
        return found
    with torch.device("meta"):
        as_written = build()
    if check_model_and_loss(as_written, loss_fn, batch, source, output)[0]:
        return found
    return [_swap_blamed(found[0], swap, source)]


def _swap_blamed(problem: str, swap: Swap, source: str) -> str:
    """The forward's failure when the model as written runs and only its tables outside the parts make it fail."""
    why = problem.split(": ", 2)[-1].split(". The model is called as")[0]
    names = few([swap.names.get(n, n) for n in swap.shapes])
    return (f"model ({source}): with its tables {names} outside the parallel parts (each nn.Embedding / "
            f"nn.EmbeddingBag swapped for a lookup into the table store, as the run's placement asks), its forward "
            f"fails on a batch of 2 dataset items, which it takes as written: {why}. The lookup takes every call "
            f"nn.Embedding and nn.EmbeddingBag take (input, offsets, per_sample_weights, by position or keyword); code "
            f"that uses a table's weight itself (emb.weight) needs the table inside the parts: remove the placement "
            f"keys that take tables out (placement.host_device_mix, placement.ps, placement.tables, tables.<name>).")


def _val_problems(validation: Any) -> list[str]:
    """val_data must be map-style: its size decides when early stopping has seen all of it."""
    from launcher.usercode.data import is_stream

    if validation is None or not is_stream(validation):
        return []
    return [f"val_data: {type(validation).__name__} is an IterableDataset; a validation split is a map-style Dataset "
            f"(with __len__ and __getitem__) here. Give one, or leave val_data out."]


def _group_reach(cfg: DictConfig) -> int:
    """How far the launcher counts a stream (no more than COUNT_MAX items): a global batch (batch.global_size), or
    else a global micro-batch where batch.micro_size and the cluster's size are numbers; so that a stream shorter than
    one is refused before launch (plan/draft.py), not by every rank."""
    batch, nodes, nproc = cfg.batch, str(cfg.cluster.nnodes).split(":")[-1], str(cfg.cluster.nproc_per_node)
    if isinstance(batch.global_size, int) and batch.global_size > 0:
        return min(batch.global_size, COUNT_MAX)
    if isinstance(batch.micro_size, int) and batch.micro_size > 0 and nodes.isdigit() and nproc.isdigit():
        return min(batch.micro_size * int(nodes) * int(nproc), COUNT_MAX)
    return 0


def _data_facts(spec: dict[str, Any], train: Any, sample: Sample, evaluation: Any, batch: Any, labels: list,
                scores: bool, output_line: str, validation: Any = None) -> DataFacts:
    """The data's facts: sizes (None for a stream), inputs, whether the labels are binary (AUC, accuracy) — each label
    element a 0/1 float with one score from the model, a BCE-style model; integer class labels keep the loss only —
    and how long an item takes to read (loader.num_workers=auto)."""
    from launcher.usercode.data import is_stream

    binary = None if not output_line else scores and all(  # no line: the forward check could not run
        torch.is_tensor(y) and y.is_floating_point() and bool(((y == 0) | (y == 1)).all()) for y in labels)
    n_train = None if is_stream(train) else len(train)
    n_eval = 0 if evaluation is None else None if is_stream(evaluation) else len(evaluation)
    inputs = f"keyword inputs {', '.join(batch[0])}" if isinstance(batch[0], Mapping) else f"{len(batch[0])} input(s)"
    seconds, share = sample.seconds, sample.cpu_share

    def size(n: int | None) -> str:
        return f"{n:,} items" if n is not None else "a stream (IterableDataset)"

    held = "none (no evaluation)" if evaluation is None else size(n_eval) if n_eval is not None else (
        "a stream (IterableDataset), of which each evaluation reads eval.batches global micro-batches (a stream "
        "need not end: raise eval.batches to read more)")
    line = (f"data: {spec['_target_']}: {size(n_train)} of {inputs} + label{', binary labels' if binary else ''}, "
            f"{seconds * 1e3:.2g} ms an item; eval_data: {held}"
            f"{f'; val_data: {len(validation):,} items' if validation is not None else ''}")
    return DataFacts(train_samples=n_train, lines=(line, output_line) if output_line else (line,),
                     binary_labels=binary, eval_samples=n_eval, item_seconds=seconds, item_cpu_share=share,
                     val_samples=len(validation) if validation is not None else 0, stream_items=sample.ended)
