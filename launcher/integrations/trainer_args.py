"""HF Trainer owns four values of the DeepSpeed config it runs with: the script's ``TrainingArguments`` decide them.

Read from transformers 5.x's installed source: ``integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.
trainer_config_process`` fills every ``"auto"`` value of the config from the TrainingArguments and collects each
other value that differs from them (``fill_match``); ``trainer_config_finalize`` then stops every rank with "Please
correct the following DeepSpeed config values that mismatch TrainingArguments values". The values it checks that a
plan sets: ``bf16.enabled`` / ``fp16.enabled`` (TrainingArguments ``bf16`` or ``bf16_full_eval``, ``fp16`` or
``fp16_full_eval``), ``gradient_accumulation_steps`` and ``gradient_clipping`` (``max_grad_norm``); the batch sizes
are handed over as ``"auto"`` already.

So, per value: no intent in the plan → ``"auto"`` (the script's TrainingArguments decide, as under ``accelerate
launch``); an intent and the script's value visible (literal keywords of its one ``TrainingArguments(...)`` call,
its defaults for the keywords it leaves out, or ``--flag value`` on its command line when it parses them with
``HfArgumentParser``) → equal, or refused before launch naming both; an intent and the value not visible (``**kwargs``,
a variable, a config file) → handed over, with a note that HF Trainer checks it at start. PURE: ast in, values out."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

ARGUMENTS_CALLS = ("TrainingArguments", "Seq2SeqTrainingArguments")
"""Calls whose keywords are TrainingArguments with transformers' defaults (TRL's configs change some defaults: their
values count as not visible)."""
DEFAULTS = {"bf16": False, "bf16_full_eval": False, "fp16": False, "fp16_full_eval": False,
            "gradient_accumulation_steps": 1, "max_grad_norm": 1.0}
"""transformers' TrainingArguments defaults of the arguments read here (checked against the installed package in
tests/plan/test_trainer_args.py)."""
OWNED = (  # (DeepSpeed config key, the TrainingArguments that give it, the plan's key)
    ("bf16.enabled", ("bf16", "bf16_full_eval"), "precision"),
    ("fp16.enabled", ("fp16", "fp16_full_eval"), "precision"),
    ("gradient_accumulation_steps", ("gradient_accumulation_steps",), "batch.grad_accum"),
    ("gradient_clipping", ("max_grad_norm",), "trainer.grad_clip"),
)
UNKNOWN = object()
BOOLS = {"": True, **dict.fromkeys(("yes", "true", "t", "y", "1"), True), **dict.fromkeys(("no", "false", "f", "n", "0"), False)}
"""What HfArgumentParser's ``string_to_bool`` reads (a bare ``--flag`` is True)."""


@dataclass(frozen=True)
class TrainerArgs:
    """What the script's own text says of its TrainingArguments."""

    values: tuple[tuple[str, Any], ...] = ()
    """Literal keywords of its one TrainingArguments(...) call among DEFAULTS' names."""
    source: str = ""
    """'code' (one TrainingArguments call, every keyword visible), 'command line' (HfArgumentParser: the script's
    arguments after --), '' (not visible)."""
    where: str = ""
    """'train.py line 15' of the call (or of HfArgumentParser)."""


def _name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def read_trainer_args(tree: ast.AST, name: str) -> TrainerArgs:
    """The TrainingArguments a script's text shows (see TrainerArgs)."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    parser = [c for c in calls if _name(c) == "HfArgumentParser"]
    if parser:
        return TrainerArgs(source="command line", where=f"{name} line {parser[0].lineno}")
    made = [c for c in calls if _name(c) in ARGUMENTS_CALLS]
    if len(made) != 1 or any(k.arg is None for k in made[0].keywords):  # none, several, or **kwargs
        return TrainerArgs()
    values = []
    for k in made[0].keywords:
        if k.arg in DEFAULTS:
            try:
                values.append((k.arg, ast.literal_eval(k.value)))
            except ValueError:
                return TrainerArgs(where=f"{name} line {made[0].lineno}")  # a variable: not visible
    return TrainerArgs(tuple(values), "code", f"{name} line {made[0].lineno}")


def _from_command_line(args: tuple[str, ...] | list[str]) -> dict[str, Any] | None:
    """HfArgumentParser's ``--name value`` / ``--name=value`` / ``--flag`` of DEFAULTS' names; None when the
    arguments come from a file (a single .json/.yaml argument, as HfArgumentParser's scripts accept)."""
    if any(str(a).endswith((".json", ".yaml", ".yml")) for a in args):
        return None
    found, i = {}, 0
    while i < len(args):
        word = str(args[i])
        key, _, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        if key in DEFAULTS:
            kind = type(DEFAULTS[key])
            following = str(args[i + 1]) if i + 1 < len(args) else "--"
            if not value and not following.startswith("--") and (kind is not bool or following.lower() in BOOLS):
                value, i = following, i + 1
            try:
                found[key] = BOOLS.get(value.lower(), None) if kind is bool else kind(value)
                if found[key] is None:
                    return None
            except ValueError:
                return None
        i += 1
    return found


def script_value(args: TrainerArgs, script_args: tuple[str, ...] | list[str], names: tuple[str, ...]) -> Any:
    """The TrainingArguments value behind one DeepSpeed key (an ``or`` of its names for the precision flags), or
    UNKNOWN."""
    given = dict(args.values) if args.source == "code" else \
        _from_command_line(script_args) if args.source == "command line" else None
    if given is None:
        return UNKNOWN
    values = [given.get(n, DEFAULTS[n]) for n in names]
    return any(values) if isinstance(DEFAULTS[names[0]], bool) else values[0]


def _lookup(config: dict, dotted: str) -> tuple[dict | None, str]:
    *path, leaf = dotted.split(".")
    node = config
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), leaf


def reconcile(config: dict, intents: set[str], args: TrainerArgs,
              script_args: tuple[str, ...] | list[str]) -> tuple[list[str], list[str]]:
    """Make the handed-over DeepSpeed config agree with HF Trainer's TrainingArguments (changes ``config`` in place);
    (problems, notes). ``intents``: the plan keys the run sets (precision, batch.grad_accum, trainer.grad_clip)."""
    problems, unseen = [], []
    for ds_key, names, plan_key in OWNED:
        node, leaf = _lookup(config, ds_key)
        if node is None or leaf not in node:
            continue
        if plan_key not in intents:
            node[leaf] = "auto"  # the script's TrainingArguments decide
            continue
        theirs = script_value(args, script_args, names)
        if theirs is UNKNOWN:
            unseen.append(f"{ds_key}={node[leaf]} ({plan_key})")
        elif theirs != node[leaf]:
            shown = "=".join((names[0], repr(theirs)))
            at = f"{args.where} or its defaults" if args.source == "code" else f"its command line ({args.where})"
            problems.append(
                f"{plan_key} makes the DeepSpeed config's {ds_key}={node[leaf]}, but the HF Trainer script's "
                f"TrainingArguments give {shown} ({at}): HF Trainer takes {ds_key} from its TrainingArguments and "
                f"stops every rank when the config differs (transformers/integrations/deepspeed.py "
                f"trainer_config_process). Set {names[0]} to match in the script (or on its command line after --), "
                f"or drop {plan_key} and let the script decide.")
    notes = [f"HF Trainer checks {', '.join(unseen)} against its TrainingArguments, which the launcher cannot see "
             f"in the script's text: a differing value stops the run at its start, naming both."] if unseen else []
    return problems, notes
