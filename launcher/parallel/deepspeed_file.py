"""deepspeed.config: your DeepSpeed config merged with the one the deepspeed part compiles (pure, torch-free).

The rule, in three steps (docs/parallelism.md, "Bring your DeepSpeed config"):

1. **Adopt** (before the plan, ``adopt``): a file key hetero-launch models (``INTENT_KEYS``: the ZeRO stage, the
   offload devices and their pin_memory, bf16/fp16, the batch triple, gradient_clipping, the optimizer section)
   becomes our key's value when our key is *not set*: not named on the command line and at its schema default (the
   recipe's YAML may set it: then it is set). The plan is then made as if you had typed it, and says so in a note.
2. **Merge** (the deepspeed part's config, ``merge``): the compiled config, then every file key on top of it. Where
   the compiled config holds an intent's value (``owned``: the emitter's rows that name our key) the file must agree,
   after an ``"auto"`` is resolved to the compiled value, or the plan stops naming the file's key and value, ours,
   and the fix. Every other key passes through to DeepSpeed (overlap_comm, bucket sizes, contiguous_gradients, a
   scheduler, monitors, ...), replacing what we emit for DeepSpeed's own bookkeeping (steps_per_print).
3. **Nothing silently ignored**: the optimizer section becomes optimizer.* and is not emitted (the ranks hand
   DeepSpeed a torch optimizer); an ``"auto"`` we cannot resolve is refused with the reason (DeepSpeed does not
   resolve it); sections that do nothing here (DeepSpeed's activation_checkpointing, pipeline, elasticity) are
   refused with the key to use; and a run whose data-parallel part is not deepspeed refuses every key only
   DeepSpeed reads (``unused``). DeepSpeed's own parser checks the merged result before launch, and names a key it
   never read (launcher/launch/deepspeed_check.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

ABSENT = object()
"""A key the file does not have."""


def _choice(table: dict[Any, Any], what: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        key = value.lower() if isinstance(value, str) else value
        if key not in table:
            raise ValueError(f"{what} is one of {', '.join(map(str, table))} here")
        return table[key]

    return convert


def _number(kind: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise ValueError(f"it must be a{'n integer' if kind is int else ' number'}")
        return kind(value)

    return convert


_PIN = _choice({True: "true", False: "false"}, "pin_memory")
_NVME = "offload to nvme is not planned here (the memory plan knows host and device only): use cpu"


@dataclass(frozen=True)
class IntentKey:
    file: str
    """The dotted DeepSpeed key."""
    ours: str
    """Our dotted key it sets."""
    to_ours: Callable[[Any], Any]
    """The file's value as our key's (None: it asks for nothing, e.g. bf16.enabled false); ValueError: refused."""


INTENT_KEYS: tuple[IntentKey, ...] = (
    IntentKey("zero_optimization.stage", "zero.stage", _choice({0: 0, 1: 1, 2: 2, 3: 3}, "the stage")),
    IntentKey("zero_optimization.offload_optimizer.device", "optimizer.target",
              _choice({"cpu": "CPU", "none": "device", "nvme": ValueError}, "device")),
    IntentKey("zero_optimization.offload_param.device", "placement.offload_params",
              _choice({"cpu": True, "none": False, "nvme": ValueError}, "device")),
    IntentKey("zero_optimization.offload_optimizer.pin_memory", "placement.pin_memory", _PIN),
    IntentKey("zero_optimization.offload_param.pin_memory", "placement.pin_memory", _PIN),
    IntentKey("bf16.enabled", "precision", _choice({True: "bf16", False: None}, "enabled")),
    IntentKey("bfloat16.enabled", "precision", _choice({True: "bf16", False: None}, "enabled")),
    IntentKey("fp16.enabled", "precision", _choice({True: "fp16", False: None}, "enabled")),
    IntentKey("train_batch_size", "batch.global_size", _number(int)),
    IntentKey("train_micro_batch_size_per_gpu", "batch.micro_size", _number(int)),
    IntentKey("gradient_accumulation_steps", "batch.grad_accum", _number(int)),
    IntentKey("gradient_clipping", "trainer.grad_clip", _number(float)),
    IntentKey("optimizer.type", "optimizer.name", _choice({"adam": "adam", "adamw": "adamw", "sgd": "sgd"}, "type")),
    IntentKey("optimizer.params.lr", "optimizer.lr", _number(float)),
    IntentKey("optimizer.params.betas", "optimizer.betas", lambda v: [float(b) for b in v]),
    IntentKey("optimizer.params.eps", "optimizer.eps", _number(float)),
    IntentKey("optimizer.params.weight_decay", "optimizer.weight_decay", _number(float)),
    IntentKey("optimizer.params.momentum", "optimizer.momentum", _number(float)),
)
BY_FILE = {k.file: k for k in INTENT_KEYS}

NO_EFFECT = {
    "activation_checkpointing": "it configures deepspeed.checkpointing, which nothing here calls: use recompute=[...]",
    "pipeline": "hetero-launch's pipelines are torch.distributed.pipelining's: use parallel.pipeline_stages",
    "elasticity": "it changes the batch sizes the plan solved: use batch.* and cluster.*",
    "sparse_gradients": "DeepSpeed >= 0.19 rejects it: tables train sparse outside the parts (placement.*)",
}
"""Top-level sections that would do nothing (or break the plan) on this run, and what to use instead."""

HF_AUTO = {
    "zero_optimization.reduce_bucket_size": "HF derives it from model.config.hidden_size",
    "zero_optimization.stage3_prefetch_bucket_size": "HF derives it from model.config.hidden_size",
    "zero_optimization.stage3_param_persistence_threshold": "HF derives it from model.config.hidden_size",
}
"""HF-style "auto" values hetero-launch has no figure for: refused with the reason (give a number, or remove the key
for DeepSpeed's default)."""


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of nested dicts (lists are values)."""
    if isinstance(node, dict) and (node or not prefix):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def lookup(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        if not isinstance(tree.get(key), dict):
            tree[key] = {}
        tree = tree[key]
    tree[leaf] = value


RESOLVED_AUTO = {"scheduler.params.warmup_max_lr": "optimizer.lr", "scheduler.params.total_num_steps": "trainer.steps",
                 "scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_num_steps": 0}
"""HF-style "auto" values of keys we do not compile, filled as HF's Trainer fills them: from our keys, or 0 (no
warmup: hetero-launch has no warmup keys, and HF's Trainer without warmup arguments fills 0 too)."""


EARLY_CONFLICTS = ("optimizer.", "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
"""File keys whose disagreement with a key of ours that is set is said by ``adopt``, before the plan: the optimizer
section (not emitted, so ``merge`` never sees it), and the batch triple (the batch solver's own problem, with the
sizes adopted from the file, came first and hid it until the batch divided)."""


def adopt(cfg: Any, file: dict[str, Any], source: str, is_set: Callable[[str], bool]
          ) -> tuple[list[str], list[str]]:
    """(notes, problems): set each of our keys the file models and ``is_set`` says is not set (in ``cfg``, which the
    caller copied); the optimizer section's conflicts with keys that are set (it is not emitted, so ``merge`` does
    not see it); RESOLVED_AUTO's "auto" values filled in ``file`` (the caller's copy)."""
    from omegaconf import OmegaConf

    notes, problems = [], []
    for key in INTENT_KEYS:
        value = lookup(file, key.file)
        if value is ABSENT or value == "auto":
            continue
        try:
            ours = key.to_ours(value)
            if ours is ValueError:
                raise ValueError(_NVME)
        except (ValueError, TypeError) as e:
            problems.append(f"deepspeed.config: {key.file}={_show(value)} in {source}: {e}. Fix it in the file, or "
                            f"remove it and set {key.ours}.")
            continue
        if ours is None:
            continue
        current = OmegaConf.select(cfg, key.ours)
        current = list(current) if key.ours == "optimizer.betas" else current
        if not is_set(key.ours):
            if current != ours:
                OmegaConf.update(cfg, key.ours, ours)
                notes.append(f"{key.ours}={_show(ours)} from deepspeed.config {source} ({key.file}={_show(value)})")
        elif key.file.startswith(EARLY_CONFLICTS) and current != ours:
            problems.append(conflict(key.file, value, source, f"{key.ours}={_show(current)}", key))
    section = file.get("optimizer")
    for dotted, value in leaves(section, "optimizer") if isinstance(section, dict) else ():
        if dotted not in BY_FILE and value != {}:
            known = ", ".join(k.file for k in INTENT_KEYS if k.file.startswith("optimizer."))
            problems.append(f"deepspeed.config: {dotted}={_show(value)} in {source} would do nothing: the ranks give "
                            f"DeepSpeed a torch optimizer built from optimizer.* (this file's optimizer section is "
                            f"read from {known} only). Remove it.")
    for dotted, ours in RESOLVED_AUTO.items():
        if lookup(file, dotted) == "auto":
            if ours == "trainer.steps" and cfg.trainer.epochs > 0:
                problems.append(f"deepspeed.config: {dotted}=\"auto\" in {source} with trainer.epochs: the steps are "
                                f"known only once the data is read. Give a number.")
                continue
            value = OmegaConf.select(cfg, ours) if isinstance(ours, str) else ours
            put(file, dotted, value)
            why = ours if isinstance(ours, str) else "no warmup"
            notes.append(f"deepspeed.config: {dotted}=\"auto\" -> {value} ({why})")
    return notes, problems


def refused(key: IntentKey | None, value: Any) -> bool:
    """Whether ``value`` is one ``adopt`` refuses for ``key`` (it said why: nothing more to say of it)."""
    if key is None:
        return False
    try:
        return key.to_ours(value) is ValueError
    except (ValueError, TypeError):
        return True


def conflict(file_key: str, value: Any, source: str, ours: str, key: IntentKey | None) -> str:
    """The message of a file key that disagrees with an intent: both sides and the fix."""
    fix = f"remove {file_key} from {source}"
    if key is not None and not refused(key, value):
        fix += f", or set {key.ours}={_show(key.to_ours(value))}"
    return (f"deepspeed.config: {file_key}={_show(value)} in {source} conflicts with {ours}. Make them agree: {fix} "
            f"(a key of ours left unset takes the file's value).")


def merge(compiled: dict[str, Any], file: dict[str, Any], owned: dict[str, tuple[Any, str]], off: dict[str, Any],
          source: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """(merged config, problems, notes): ``compiled`` with the file on top. ``owned``: compiled key -> (its value,
    our key=value) for the keys an intent decides; ``off``: keys we leave out when the intent is off -> the value
    that means off (an offload device: none)."""
    merged, problems, notes = copy.deepcopy(compiled), [], []
    for key, reason in NO_EFFECT.items():
        if key in file:
            problems.append(f"deepspeed.config: {key} in {source} would do nothing here ({reason}). Remove it.")
    for dotted, value in leaves(file):
        if dotted.split(".")[0] in NO_EFFECT or dotted.startswith("optimizer.") or value == {}:
            continue  # an empty section ({}) sets nothing: DeepSpeed's defaults, or what we compiled
        if value != "auto" and refused(BY_FILE.get(dotted), value):
            continue  # adopt said why
        if dotted in owned:
            mine, ours = owned[dotted]
            if value != "auto" and (value != mine or isinstance(value, bool) != isinstance(mine, bool)):
                problems.append(conflict(dotted, value, source, f"{ours} (compiled: {dotted}={_show(mine)})",
                                         BY_FILE.get(dotted)))
            continue
        if dotted in off:
            if value not in ("auto", off[dotted]):
                key = BY_FILE.get(dotted)
                problems.append(conflict(dotted, value, source, f"{key.ours if key else dotted} (compiled: off)", key))
            continue
        if value == "auto":
            why = HF_AUTO.get(dotted, "hetero-launch compiles no value for it")
            problems.append(f"deepspeed.config: {dotted}=\"auto\" in {source} cannot be resolved ({why}; DeepSpeed "
                            f"does not resolve \"auto\"). Give a value, or remove the key for DeepSpeed's default.")
            continue
        put(merged, dotted, value)
    stage3 = [d for d, _ in leaves(file) if d.startswith("zero_optimization.stage3_")]
    if stage3 and lookup(merged, "zero_optimization.stage") != 3:
        notes.append(f"deepspeed.config: {', '.join(stage3)} in {source} act at ZeRO-3 only: not applied at "
                     f"ZeRO-{lookup(merged, 'zero_optimization.stage')}")
    if "optimizer" in file:
        notes.append(f"deepspeed.config: the optimizer section of {source} is compiled into optimizer.* (the ranks "
                     f"give DeepSpeed a torch optimizer), not passed on")
    return merged, problems, notes


def unused(file: dict[str, Any]) -> list[str]:
    """The file's keys that only DeepSpeed reads (none is an intent): they do nothing on a run without the deepspeed
    part."""
    return [d for d, _ in leaves(file) if d not in BY_FILE and not d.startswith("optimizer.")]


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if value == "auto" else str(value)


def adopt_config(cfg: Any) -> tuple[Any, list[str], list[str]]:
    """(cfg with deepspeed.config's intents adopted, notes, problems); ``cfg`` itself when there is no file. A key of
    ours is set when the command line named it (deepspeed.given) or it differs from the schema's default."""
    from omegaconf import DictConfig, OmegaConf

    from launcher.schema import HeteroConfig

    section = cfg.get("deepspeed")
    if section is None or section.config is None:
        return cfg, [], []
    if not isinstance(section.config, DictConfig):
        return cfg, [], [f"deepspeed.config={section.config}: give a JSON file's path (read before planning) or a "
                         f"mapping of DeepSpeed keys, e.g. 'deepspeed.config={{zero_optimization: {{stage: 2}}}}'."]
    cfg = copy.deepcopy(cfg)
    defaults = OmegaConf.structured(HeteroConfig)
    given = set(cfg.deepspeed.given)

    def is_set(key: str) -> bool:
        parts = key.split(".")
        if any(".".join(parts[:n]) in given for n in range(1, len(parts) + 1)):
            return True
        return OmegaConf.select(cfg, key) != OmegaConf.select(defaults, key)

    file = OmegaConf.to_container(cfg.deepspeed.config, resolve=True)
    notes, problems = adopt(cfg, file, cfg.deepspeed.source or "the inline config", is_set)
    cfg.deepspeed.config = file  # with the "auto" values adopt resolved
    return cfg, notes, problems

