"""What the command line's overrides may not do, checked as the config is composed (launcher/config.py): set Hydra's
own run settings (which hetero-launch does not use), leave a competing pair (steps and epochs) undecided, set a key
the launcher fills in itself, pick data a built-in recipe does not have, give a config group anything but an
option's name or a section of keys a single value, remove a key of the schema, or hold a value Hydra's grammar cannot
read unquoted; and words that are not overrides at all (``--steps 5``, ``key = value``), said as the override to
write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

from launcher.schema import TableConfig

HYDRA_HINTS = {"hydra.run.dir": "a run's files go to output.log_dir/<run name>: set output.log_dir={v} (and "
                                 "output.run_name=<name> to name the run's own folder)",
               "hydra.sweep.dir": "a sweep's runs go to output.log_dir/sweep-<date>-<time>/<job>: set "
                                   "output.log_dir={v}",
               "hydra.sweep.subdir": "a sweep's jobs are numbered folders of its sweep dir",
               "hydra.job.chdir": "ranks run in the folder hetero-launch is started in"}
"""What a user who writes one of Hydra's own run settings wants instead."""


def quote_hint(overrides: list[str]) -> str:
    """For the first override whose value Hydra's grammar cannot read as it is (>50K, a space, a colon): how to quote
    it, on the command line and in a shell."""
    for line in overrides:
        key, sep, value = line.partition("=")
        if not sep or not value or value[0] in "'\"":
            continue
        try:
            OverridesParser.create().parse_overrides([line])
        except HydraException:
            return (f" A value with characters Hydra's grammar reserves is quoted: {key}='{value}' (in a shell, "
                    f"\"{key}='{value}'\").")
    return ""


def unparsable(given: list[str], recipes: Sequence[str]) -> list[str]:
    """For a command line Hydra's grammar cannot read: what each word that is not an override was likely meant as
    (a recipe's bare name, argparse's --key value, key value, key = value), said as the override to write."""
    problems, skip = [], 0
    for i, word in enumerate(given):
        after = given[i + 1] if i + 1 < len(given) else None
        if skip or "=" in word and not word.startswith("-"):
            skip = max(skip - 1, 0)
            continue
        value = after if after is not None and "=" not in after and not after.startswith("-") else None
        if word.startswith("-") and word not in ("-m", "--multirun"):
            key, _, inline = word.lstrip("-").partition("=")
            shown = f"{word} {value}" if value and not inline else word
            problems.append(f"{shown}: hetero-launch takes Hydra's key=value overrides, not --options. Write "
                            f"{key}={inline or value or '<value>'} (the full key: docs/configuration.md).")
            skip = 1 if value and not inline else 0
        elif after is not None and (after == "=" or after.startswith("=")):
            rest = after[1:] or (given[i + 2] if i + 2 < len(given) else "<value>")
            problems.append(f"{word} {after}{'' if after[1:] else ' ' + rest}: no spaces around '='. Write "
                            f"{word}={rest}.")
            skip = 1 if after[1:] else 2
        elif word in recipes:
            problems.append(f"{word}: a recipe is chosen by key. Write recipe={word}.")
        elif value is not None:
            problems.append(f"{word} {value}: an override is one word, key=value. Write {word}={value}.")
            skip = 1
        else:
            problems.append(f"{word}: not an override (key=value). Write {word}=<value>, or leave it out.")
    return problems


def hydra_keys(parsed, quiet: tuple[str, ...] = ()) -> list[str]:
    """Hydra's own settings on the command line (hydra.run.dir, hydra/launcher=...): hetero-launch composes the config
    with Hydra's compose API and runs the job itself, so they would do nothing. hydra.searchpath (more config folders)
    and the logging groups the launcher sets itself are what compose reads."""
    out = []
    for o in parsed:
        key = o.key_or_group.lstrip("+~")
        if not key.startswith(("hydra.", "hydra/")) or key == "hydra.searchpath" or \
                f"{key}={o.value()}" in quiet:
            continue
        out.append(hydra_setting(key, o.value()))
    return out


def hydra_setting(key: str, value: Any) -> str:
    """Why Hydra's own run setting ``key`` does nothing here, and what the user wants instead."""
    hint = HYDRA_HINTS.get(key, "remove it").format(v=value)
    return (f"{key}={value}: Hydra's own run settings do nothing here (hetero-launch composes the config with Hydra "
            f"and runs the job itself): {hint}.")


def hydra_section(section: Any, key: str = "hydra") -> list[str]:
    """``hydra_setting`` of each setting of a ``hydra:`` section written in a recipe file (where a Hydra app keeps
    them): every one, since a recipe is no primary config and Hydra reads none of it."""
    if isinstance(section, dict) and section:
        return [line for k, v in section.items() for line in hydra_section(v, f"{key}.{k}")]
    return [hydra_setting(key, section)]


COMPETING = (
    # (a key, the key it competes with, that key's value when it stands aside, why they compete, whether they are
    # two names of one number: then equal values agree)
    ("trainer.steps", "trainer.epochs", 0, "epochs > 0 trains that many passes over the data instead of a number of "
                                           "steps", False),
    ("batch.grad_accum", "batch.micro_batches", -1, "batch.micro_batches (a pipeline's name for the micro-batches of "
                                                    "a step) sets batch.grad_accum when it is not -1", True),
    ("parallel.partition", "parallel.stages", {}, "parallel.stages places every layer itself; parallel.partition "
                                                  "splits the layers only when it is empty", False),
)
"""Pairs of keys of which one decides. The one the user writes wins over a recipe's or data option's default for the
other (data=tabular's trainer.epochs: 5, resnet's batch.micro_batches and parallel.stages); both written is refused,
naming both."""


def competing_keys(cfg: DictConfig, parsed) -> list[str]:
    """Each COMPETING pair settled on ``cfg`` (the user's key wins: the other stands aside), or a problem naming
    both."""
    given = {o.key_or_group.lstrip("+~") for o in parsed}
    problems = []
    for key, other, aside, why, one_number in COMPETING:
        # a value that does not resolve (${nope}) reads as None here; the config's resolve names it
        mine, theirs = (OmegaConf.select(cfg, k, throw_on_resolution_failure=False) for k in (key, other))
        if not _wrote(given, key) or _plain(theirs) == aside or (one_number and mine == theirs):
            continue
        if not _wrote(given, other):
            OmegaConf.update(cfg, other, aside, merge=False)  # the user's key over a default's
        else:
            problems.append(f"{key}={_plain(mine)} and {other}={_plain(theirs)} were both given: {why}. Give one of "
                            f"them ({other}={aside} to use {key}).")
    return problems


def optimizer_stands_aside(cfg: DictConfig, parsed) -> None:
    """optimizer.name=<other> on the command line: the recipe's settings of hyper-parameters the chosen optimizer
    does not take (quickstart's momentum with optimizer.name=adam) were for the recipe's own optimizer and stand aside
    for the schema's defaults, as a COMPETING key does; one the command line gives too is the user's, and the plan
    refuses it, naming the optimizer (launcher/plan/rules.py unused_optimizer_keys)."""
    from launcher.plan.registry import unread_optimizer_keys
    from launcher.schema import OptimizerConfig

    given = {o.key_or_group.lstrip("+~") for o in parsed}
    if not _wrote(given, "optimizer.name") or not isinstance(cfg.get("optimizer"), DictConfig):
        return
    tables = cfg.get("tables") or {}
    rows = [OmegaConf.select(t, "optimizer", default=None) for t in tables.values()] if tables else []
    for key in unread_optimizer_keys(str(cfg.optimizer.name), rows):
        if not _wrote(given, f"optimizer.{key}"):
            OmegaConf.update(cfg, f"optimizer.{key}", getattr(OptimizerConfig(), key), merge=False)


def _wrote(given: set[str], key: str) -> bool:
    """The command line set ``key`` or an entry of it (+parallel.stages.head=0)."""
    return any(g == key or g.startswith(f"{key}.") for g in given)


def _plain(value):
    """A config value as the user wrote it (a dict or list without OmegaConf's wrapper; 5.0 as 5)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


LAUNCHER_SET = {"deepspeed.given": "the keys the command line gave with deepspeed.config",
                "deepspeed.source": "the file deepspeed.config was read from",
                "smoke_changes": "what smoke=true's profile changed"}
"""Keys the launcher fills in itself (and records in the run dir's config.yaml): a value given would be replaced."""


def launcher_set_keys(parsed, smoke: bool) -> list[str]:
    """Overrides of the keys the launcher sets itself (LAUNCHER_SET), and of smoke_profile without smoke=true (read
    by a smoke run only): each would do nothing."""
    out = []
    for o in parsed:
        key = o.key_or_group.lstrip("+~")
        top = next((k for k in LAUNCHER_SET if key == k or key.startswith(f"{k}.")), None)
        if top is not None:
            out.append(f"{key}={o.value()}: set by the launcher ({LAUNCHER_SET[top]}), so a value given here would be "
                       f"replaced. Remove it.")
        elif (key == "smoke_profile" or key.startswith("smoke_profile.")) and not smoke:
            out.append(f"{key}={o.value()}: the smoke profile is read by smoke=true only, so without it this does "
                       f"nothing. Add smoke=true, or remove it.")
    return out


def data_option(parsed, recipes: Sequence[Any]) -> tuple[list[str], list[str]]:
    """(lines to drop, problems) for ``data=<option>`` against the chosen built-in recipe's data options (its
    ``data_configs``; the configuration reference lists them as "recipe=gpt, data=markov"). Hydra's ``data`` group
    holds only the options with a file of their own (wide_deep's); a recipe with one option has it built in, so
    ``data=<that option>`` selects what the recipe already uses (dropped here: Hydra has no such file), and an
    option the recipe does not have is named with the recipe's own, not Hydra's "No match in the defaults list"."""
    if len(recipes) != 1:
        return [], []
    recipe = recipes[0]
    options = list(recipe.data_configs)
    drop, problems = [], []
    for o in parsed:
        value = o.value()
        if o.key_or_group != "data" or not isinstance(value, str):
            continue
        if value not in options:
            pick = "one of them" if len(options) > 1 else "it"
            problems.append(f"data={value}: recipe {recipe.name} has no data {value}; its data: "
                            f"{', '.join(options)}. Pick {pick}, or leave data= out (the recipe's own).")
        elif len(options) == 1:
            drop.append(o.input_line)
    return drop, problems


def appends(parsed, base: DictConfig, groups) -> list[str]:
    """``+key=value`` adds a key; where one with a plain value is there already, or a single value onto a section of
    keys, Hydra said only "Could not append to config" (checked once composing failed, against the config of the
    group choices alone). A mapping into a mapping that is there, or anything onto a null key, ``+`` merges
    (``+tables={...}``, ``+val_data=...``)."""
    problems = []
    for o in parsed:
        key = o.key_or_group
        if not o.is_add() or key in groups:
            continue
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(base, parent_key, default=None) if parent_key else base
        here = OmegaConf.select(base, key, default=None, throw_on_resolution_failure=False, throw_on_missing=False)
        if not (isinstance(parent, DictConfig) and leaf in parent.keys()):
            continue
        if not (here is None or OmegaConf.is_config(here)):
            value = o.input_line.partition("=")[2]
            problems.append(f"{o.input_line}: {key} is there already (+ adds a key that is not); write {key}={value} "
                            f"to set it.")
        elif not isinstance(o.value(), dict) and (single := section_given_value(o.input_line, key, here)):
            problems.append(single)  # +model=foo: Hydra's "Could not append to config"
    return problems


OPEN_SECTIONS = ("model", "data", "loss", "eval_data", "val_data")
"""The recipe's sections of any shape (a ``_target_`` and its arguments): composing takes a single value there."""


def section_given_value(line: str, key: str, section: Any) -> str | None:
    """The problem of ``key=value`` (a single value, or a list) where ``key`` is a section of keys in the config
    without it (``section``: what is there), or None when it is not a section."""
    if not isinstance(section, DictConfig):
        return None
    keys = [str(k) for k in section.keys()]
    example = next((k for k in keys if k != "_target_"), "<key>")
    other = f", or another class: {key}._target_=<module.Class>" if "_target_" in keys else ""
    listed = f"; its keys: {', '.join(keys)}" if keys else ""
    if OmegaConf.get_type(section) is dict and key.split(".")[0] not in OPEN_SECTIONS:  # names of your choosing
        return (f"{line}: {key} maps names of your choosing to values, not a single value{listed}. Add one with a "
                f"leading + (Hydra adds to such a mapping only so), e.g. '+{key}.<name>=<value>' for a name it has "
                f"not, or give it whole: "
                f"'+{key}={{<name>: <value>}}'.")
    return (f"{line}: {key} is a section of keys, not a single value{listed}. Set one key at a time, e.g. "
            f"{key}.{example}=<value>{other}.")


def sections_given_values(parsed, groups, base_of) -> list[str]:
    """``model=foo``: a recipe section of any shape (OPEN_SECTIONS, or a mapping inside one) given a single value
    composes, and then failed far from the cause (an interpolation into it: "node `model` is not a container").
    ``base_of()``: the config without the key overrides, composed only when one such override is given."""
    given = [o for o in parsed if not o.is_delete() and o.key_or_group not in groups
             and o.key_or_group.split(".")[0] in OPEN_SECTIONS and not isinstance(o.value(), (dict, type(None)))]
    base = base_of() if given else None
    problems = []
    for o in given if base is not None else ():
        here = OmegaConf.select(base, o.key_or_group, default=None, throw_on_resolution_failure=False,
                                throw_on_missing=False)
        problems += [p for p in [section_given_value(o.input_line, o.key_or_group, here)] if p]
    return problems


def shapeless(parsed, groups, chosen: Sequence[str]) -> list[str]:
    """Overrides Hydra parses but cannot use: no key before the ``=`` (``=5``; Hydra raised "Config group override
    must be a string or a list"), ``recipe=`` twice with different recipes (``chosen``, in the order given: a run
    trains one; the launcher would plan the first and Hydra compose the last), or a sweep without -m (sweeps expand
    before this: launch/sweep.py)."""
    problems = [f"{o.input_line}: nothing before the '='. An override is key=value, e.g. trainer.steps=5."
                for o in parsed if not o.key_or_group.lstrip("+~")]
    recipes = list(dict.fromkeys(chosen))
    if len(recipes) > 1:
        problems.append(f"recipe= was given {len(recipes)} times ({', '.join(recipes)}): a run trains one recipe. "
                        f"Keep one recipe=<name> (or sweep them: -m recipe={','.join(recipes)}).")
    for o in parsed:
        if o.is_sweep_override():  # Hydra: "Ambiguous value for argument"
            as_list = "" if o.key_or_group in groups else f" A list is written in brackets: {o.key_or_group}=[...]."
            problems.append(f"{o.input_line}: a value with commas (or a range) is a sweep, which runs with -m: "
                            f"hetero-launch -m {o.input_line} <the other overrides>.{as_list}")
    return problems


def group_values(parsed, options: dict[str, list[str]]) -> list[str]:
    """A config group's override (``recipe=``, ``data=``, ``parallel=``, ``placement=``: ``options`` maps each to its
    options) picks one option by name. Hydra reads ``null``, a number, a boolean, a list or a mapping there too and
    then fails with a ValueError or TypeError of its own (a list would merge several options: none of ours composes
    that way)."""
    problems = []
    for o in parsed:
        if o.key_or_group not in options or o.is_delete() or isinstance(o.value(), str) or o.is_sweep_override():
            continue  # one option by name, or a sweep (-m recipe=a,b) the multirun expands
        group, named = o.key_or_group, options[o.key_or_group]
        leave = "" if group == "recipe" else f", or leave {group}= out"
        example = named[0] if named else "<name>"
        problems.append(f"{o.input_line.lstrip('+~')}: {group}= picks one option by its name; {group}'s options: "
                        f"{', '.join(named) or 'none'}. Give one, e.g. {group}={example}{leave}.")
    return problems


def deletions(parsed, base_of, groups) -> list[str]:
    """``~key`` removes a key, Hydra's way. Only a key of an open mapping can go (your recipe's model arguments, an
    entry you added). A config group is left out by not choosing it. A key of the typed schema always has a value
    (its default when not set) that the launcher reads: removing it crashed the launcher (``~trainer``) or got Hydra's
    "Error merging override". ``base_of()``: the config composed without the deletions (None when it does not compose:
    its problems are reported the usual way)."""
    deletes = [o for o in parsed if o.is_delete()]
    base = base_of() if deletes else None
    problems = []
    for o in deletes:
        key = o.key_or_group
        if key in groups:
            problems.append(f"~{key}: {key} is a config group, left out by not choosing it. Remove ~{key} (and any "
                            f"{key}=<option>).")
            continue
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(base, parent_key, default=None) if base is not None and parent_key else base
        if (isinstance(parent, DictConfig) and OmegaConf.get_type(parent) not in (dict, None)
                and leaf in parent.keys()):
            now = OmegaConf.to_container(parent, resolve=False)[leaf]
            shown = "a section" if isinstance(now, (dict, list)) else f"now {now!r}"
            problems.append(f"~{key}: {key} is a key of the config's schema, so it always has a value ({shown}) and "
                            f"cannot be removed. Set {key}=<value> to change it, or leave ~{key} out.")
    return problems


def table_path_override(line: str) -> str:
    """A table's key is its module path, which may hold dots (``towers.0.item_emb``), or its name. Hydra would read
    ``placement.tables.towers.0.item_emb=host`` as nested keys, and refuses a new key of a typed dict given field by
    field (``+tables.t1.optimizer=ftrl``); ``placement.tables.<path>=v`` becomes ``+placement.tables={<path>: v}``
    and ``tables.<path>.<field>=v`` becomes ``+tables={<path>: {<field>: v}}``, which Hydra merges (``+`` or not)."""
    key, eq, value = line.partition("=")
    bare = key.lstrip("+~")
    if not eq or key.startswith("~"):
        return line
    if bare.startswith("placement.tables.") and len(bare) > len("placement.tables."):
        return f"+placement.tables={{{bare[len('placement.tables.'):]}: {value}}}"
    if bare.startswith("tables.") and bare.count(".") >= 2:
        path, _, leaf = bare[len("tables."):].rpartition(".")
        if leaf in TableConfig.__dataclass_fields__:  # merged into the table's entry, or a new entry
            return f"+tables={{{path}: {{{leaf}: {value}}}}}"
        return f"+tables={{{bare[len('tables.'):]}: {value}}}"  # tables.<dotted path>={optimizer: ftrl, ...}
    return line


def sharding_override(line: str) -> str:
    """Operators are keys the schema cannot list: ``parallel.sharding={fc1: [[2,4],[4,1]]}`` and
    ``parallel.sharding.fc1=[[2,4],[4,1]]`` become Hydra's appends (``+...``), merged into the strategies a config
    file gave (parallel=semi_auto's)."""
    if line.startswith("parallel.sharding=") or line.startswith("parallel.sharding."):
        return "+" + line
    return line
