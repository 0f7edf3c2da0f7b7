"""Compose a config from ``conf/`` + command-line overrides, and check every override before composing.

Hydra alone stops at the first bad override with a message about dataclass internals. Here each override is
checked against the composed defaults first, so a user gets every problem at once with a did-you-mean:
``trainer.stepz=3: no such key. Did you mean trainer.steps? ...``."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import BooleanNode, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher.config_files import (check_recipe_file, composition_problem, config_dir_of, group_options,
                                   search_line, user_recipes, yaml_problem)
from launcher.config_overrides import (OPEN_SECTIONS, appends, competing_keys, data_option, deletions, group_values,
                                       hydra_keys, launcher_set_keys, optimizer_stands_aside, quote_hint,
                                       section_given_value, sections_given_values, shapeless, sharding_override,
                                       table_path_override, unparsable)
from launcher.config_hints import mapping_without_plus, unknown_key
from launcher.errors import ConfigError, did_you_mean, first_line
from launcher.plain import missing_keys, to_plain
from launcher.schema import TableConfig, register_schemas

CONFIG_MODULE = "launcher.conf"
CONFIG_NAME = "config"
HYDRA_QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
"""Hydra's logging configs: compose() builds them and then drops them with the rest of its own config (a run logs
through the launcher); the empty ones save ~7% of each compose. Left out where the command line picks them."""


def compose_config(overrides: Sequence[str], config_dir: str | None = None) -> DictConfig:
    """The resolved config for these overrides, or ConfigError listing every problem. ``config_dir`` (Hydra's
    ``--config-dir``) adds the user's config tree to the package's: their ``recipe/<name>.yaml`` is a recipe."""
    from launcher.recipes import RECIPES

    given = list(overrides)
    overrides = [sharding_override(table_path_override(o)) for o in given]
    said = {new: old for old, new in zip(given, overrides) if new != old}  # messages quote the user's own line
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(unparsable(given, list(RECIPES)) or f"could not parse the command line: {e}. Overrides "
                          f"look like key=value.{quote_hint(given)}") from None
    if refused := hydra_keys(parsed, tuple(HYDRA_QUIET)):
        raise ConfigError(refused)
    users = user_recipes(config_dir)
    chosen = [o.value() for o in parsed if o.key_or_group == "recipe" and isinstance(o.value(), str)]
    built_in = [RECIPES[c] for c in chosen if c in RECIPES]
    groups = group_options(users, built_in)
    if refused := shapeless(parsed, groups, chosen) or group_values(parsed, groups):
        raise ConfigError(refused)
    register_schemas([r.name for r in built_in])
    drop, refused = data_option(parsed, built_in)
    if refused:
        raise ConfigError(refused)
    overrides, parsed = [o for o in overrides if o not in drop], [o for o in parsed if o.input_line not in drop]
    clash = sorted(set(users) & set(RECIPES))
    if clash:
        raise ConfigError(f"--config-dir {config_dir}: recipe/{clash[0]}.yaml has the name of a built-in recipe. "
                          f"Rename your file (and its recipe.name), e.g. recipe/my_{clash[0]}.yaml.")
    for name in chosen:
        if name in users:
            check_recipe_file(Path(config_dir) / "recipe" / f"{name}.yaml", f"{config_dir}/recipe/{name}.yaml")
    search = [search_line(config_dir)] if config_dir is not None else []
    search += [q for q in HYDRA_QUIET if not any(o.key_or_group == q.split("=")[0] for o in parsed)]
    script_mode = any(o.key_or_group == "script" for o in parsed)  # a user's own script: no recipe
    bases: dict[tuple[str, ...], DictConfig | ConfigError] = {}  # _compose_once's, for this call's Hydra
    GlobalHydra.instance().clear()
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        if not (script_mode or chosen):
            raise ConfigError(_diagnose(parsed, script_mode, users, search, bases))
        if script_mode and chosen:
            raise ConfigError(f"script= and recipe={chosen[0]} were both given: a run is either your own script or a "
                              f"recipe. Drop one of them.")
        if refused := deletions(parsed, lambda: _base_or_none([*search, *(o.input_line for o in parsed
                                                                            if not o.is_delete())], bases), groups):
            raise ConfigError(refused)
        try:
            cfg = compose(config_name=CONFIG_NAME, overrides=[*search, *overrides])  # the usual case: all is well
        except yaml.YAMLError as e:  # a config file (the user's recipe, most likely) that is not YAML
            raise ConfigError(yaml_problem(e)) from None
        except (HydraException, OmegaConfBaseException) as first_error:
            arguments = _constructor_arguments(parsed, search, bases)  # loss.reduction=mean: not in the file
            try:
                if not arguments:
                    raise first_error
                overrides = [arguments.get(o.input_line, o.input_line) for o in parsed]
                parsed = OverridesParser.create().parse_overrides(overrides)
                cfg = compose(config_name=CONFIG_NAME, overrides=[*search, *overrides])
            except (HydraException, OmegaConfBaseException) as error:
                problems = _diagnose(parsed, script_mode, users, search, bases) or [first_line(error)]
                raise ConfigError([_as_given(p, said) for p in problems]) from None
        optimizer_stands_aside(cfg, parsed)
        chosen_only = [*search, *(o.input_line for o in parsed if o.key_or_group in groups)]
        added = (_added_unknown_keys(cfg, parsed) + _numbers_as_bools(cfg, parsed) + competing_keys(cfg, parsed)
                 + launcher_set_keys(parsed, bool(cfg.smoke))
                 + sections_given_values(parsed, groups, lambda: _base_or_none(chosen_only, bases)))
        if added:
            raise ConfigError(added)
        if cfg.smoke:
            cfg = _compose_smoke(cfg, overrides, search, script_mode)
            optimizer_stands_aside(cfg, parsed)
            competing_keys(cfg, parsed)  # composed again: the user's key wins again (its problems were said above)
        if cfg.deepspeed.config is not None:  # the keys a DeepSpeed file may not change (parallel/deepspeed_file.py)
            cfg.deepspeed.given = sorted({o.key_or_group.lstrip("+~") for o in parsed})
    try:  # an interpolation that does not resolve (${nope}) fails in any of these
        named = OmegaConf.select(cfg, "recipe.name", default=None, throw_on_missing=False)
        if chosen and named is not None and named != chosen[0]:
            raise ConfigError(f"recipe={chosen[0]}: its file sets recipe.name={named}. Set recipe.name to the "
                              f"file's name, {chosen[0]}.")
        missing = sorted(missing_keys(cfg))  # OmegaConf.missing_keys, fast for thousands of tables.<name> entries
        if script_mode:  # the recipe sections stay unset: a script brings its own model, data and loss
            missing = [k for k in missing if k.split(".")[0] not in ("recipe", "model", "data", "loss")]
        if missing:
            raise ConfigError([f"{k} is required and not set. " + (
                f"Give it in {config_dir}/recipe/{chosen[0]}.yaml: {k}: {{_target_: <module.Class>, ...}}." if
                k in OPEN_SECTIONS and chosen and config_dir else f"Set it on the command line: {k}=<value>.")
                for k in missing])
        to_plain(cfg, throw_on_missing=not script_mode)  # OmegaConf.to_container's checks
    except OmegaConfBaseException as e:
        where = f"Fix it in {config_dir}/recipe/{chosen[0]}.yaml, or set" if chosen and chosen[0] in users else "Set"
        raise ConfigError(f"{e.full_key}: {first_line(e)}. {where} it on the command line: "
                          f"{e.full_key}=<value>.") from None
    return cfg


def _as_given(problem: str, said: dict[str, str]) -> str:
    """A problem with each override the launcher rewrote (table_path_override) quoted as the user wrote it."""
    for new, old in said.items():
        problem = problem.replace(new, old)
    return problem


def _compose_smoke(cfg: DictConfig, overrides: Sequence[str], search: list[str], script_mode: bool) -> DictConfig:
    """The smoke run's config: the smoke settings in front of the user's overrides (theirs still win)."""
    from launcher.smoke import smoke_changes, smoke_overrides, smoke_settings

    if script_mode:
        raise ConfigError("smoke=true is for recipes: a script's own loop decides its steps and sizes. Run the script "
                          "with small arguments after --, or use a recipe.")
    settings = smoke_settings(cfg)
    try:
        smoke = compose(config_name=CONFIG_NAME, overrides=[*search, *smoke_overrides(settings), *overrides])
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(e)) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"smoke=true: the smoke profile of recipe {cfg.recipe.name} does not apply: "
                          f"{first_line(e)}. Fix smoke_profile (in the recipe's file, or where you set it).") from None
    smoke.smoke_changes = smoke_changes(cfg, smoke, list(settings))
    return smoke


def _diagnose(parsed, script_mode: bool, user_recipes: Sequence[str] = (), search: Sequence[str] = (),
              bases: dict | None = None) -> list[str]:
    """Every problem of the overrides, once composing failed: unknown group options, a missing recipe, then each
    value override checked against the defaults of the valid groups."""
    loader = GlobalHydra.instance().config_loader()
    groups = set(loader.list_groups(""))
    problems: list[str] = []
    group_lines = []
    for o in parsed:
        if o.key_or_group in groups:
            options = loader.get_group_options(o.key_or_group)
            if o.key_or_group == "recipe":
                options = sorted({*options, *user_recipes})
            value = o.value()
            if isinstance(value, str) and value not in options:
                problems.append(unknown_key(o.key_or_group, value, options, "option of"))
            else:
                group_lines.append(o.input_line)
    if not script_mode and not any(o.key_or_group == "recipe" for o in parsed):
        options = sorted({*loader.get_group_options("recipe"), *user_recipes})
        problems.append(
            f"recipe is not set. Pick one: {' | '.join(f'recipe={r}' for r in options)}, "
            f"or run your own script: script=path/to/train.py."
        )
    if problems:
        return problems
    base = _compose_once([*search, *group_lines], {} if bases is None else bases)
    for o in parsed:
        if o.key_or_group in groups or o.key_or_group.startswith("hydra"):
            continue
        key = o.key_or_group.lstrip("+~")
        if script_mode and key.split(".")[0] in OPEN_SECTIONS:  # unset with a script: no key of theirs composes
            from launcher.plan.script_keys import refusal, verdict  # as the plan refuses trainer.steps= there

            problems.append(refusal(o.input_line, verdict(key, "plain")))
            continue
        problems += _check_value_override(base, o.key_or_group, o.value(), o.input_line, o.is_delete())
    return list(dict.fromkeys(problems + appends(parsed, base, groups)))  # a problem both checks find, once


def _key_overrides(parsed) -> Iterator:
    """The overrides that set a key (not a config group's choice, not hydra's own). The groups are listed (a walk of
    the config tree, ~15 ms) only when there is an override to look at."""
    groups = None
    for o in parsed:
        if groups is None:
            groups = set(GlobalHydra.instance().config_loader().list_groups(""))
        if o.key_or_group not in groups and not o.key_or_group.startswith("hydra"):
            yield o


def _open_spec(cfg: DictConfig, key: str) -> bool:
    """Whether ``key`` is an open ``_target_`` section (not a schema dataclass): a class and its constructor's
    arguments, as loss is (and a recipe of yours' model, data and eval_data)."""
    node = OmegaConf.select(cfg, key, default=None, throw_on_missing=False) if key else None
    return (isinstance(node, DictConfig) and "_target_" in node
            and not dataclasses.is_dataclass(OmegaConf.get_type(node)))


def _constructor_arguments(parsed, search: Sequence[str], bases: dict) -> dict[str, str]:
    """{override: its ``++`` form} for each plain override that gives an open ``_target_`` section a key its file
    does not list (``loss.reduction=mean``; ``loss={_target_: ..., reduction: mean}``): a constructor's argument,
    which Hydra alone refuses as not in the config. ``++`` adds or sets it; the user-code check
    (launcher/facts/user_code.py check_target) then names an argument the constructor does not take."""
    groups = set(GlobalHydra.instance().config_loader().list_groups(""))
    try:
        base = _compose_once([*search, *(o.input_line for o in parsed if o.key_or_group in groups)], bases)
    except ConfigError:
        return {}
    out = {}
    for o in _key_overrides(parsed):
        if o.is_add() or o.is_force_add() or o.is_delete():
            continue
        key = o.key_or_group
        whole = isinstance(o.value(), dict) and _open_spec(base, key)
        if whole or (not _exists(base, key) and _open_spec(base, key.rpartition(".")[0])):
            out[o.input_line] = "++" + o.input_line
    return out


def _added_unknown_keys(cfg: DictConfig, parsed) -> list[str]:
    """``+key=value`` / ``++key=value`` that Hydra accepted into a typed section (a dataclass of the schema), where no
    such field exists: a typo would otherwise be silently ignored. Open sections (dicts: tables, placement.tables,
    parallel.stages, smoke_profile, a recipe of yours' model and data) take new keys."""
    problems = []
    for o in _key_overrides([o for o in parsed if o.is_add() or o.is_force_add()]):
        key = o.key_or_group
        parts = key.split(".")
        node = cfg
        for i, part in enumerate(parts):
            kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
            if kind is None or not dataclasses.is_dataclass(kind):
                break  # an open dict (or a list): anything goes beneath
            fields = [f.name for f in dataclasses.fields(kind)]
            if part not in fields:
                where = ".".join(parts[:i]) or "the root"
                close = difflib.get_close_matches(part, fields, n=1, cutoff=0.6)
                hint = f" Did you mean {'.'.join([*parts[:i], close[0]])}?" if close else ""
                problems.append(f"{o.input_line}: {where} has no key {part}, so the value would be ignored.{hint} "
                                f"Keys there: {', '.join(fields)}.")
                break
            node = node._get_node(part)
            node = node if isinstance(node, DictConfig) else None
    return problems


def _numbers_as_bools(cfg: DictConfig, parsed) -> list[str]:
    """``smoke=2``, ``placement.offload_params=-1``: OmegaConf takes any integer for a bool (non-zero = true); a
    number where true or false belongs is a wrong type. 0 and 1 stay accepted."""
    problems = []
    numbers = [o for o in parsed if not o.is_delete() and _number_not_bool(o.value())]
    for o in _key_overrides(numbers):
        key = o.key_or_group
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key, default=None, throw_on_missing=False) if parent_key else cfg
        if isinstance(parent, DictConfig) and isinstance(parent._get_node(leaf, throw_on_missing_key=False),
                                                         BooleanNode):
            problems.append(f"{o.input_line}: {key} is true or false, not a number. Write {key}=true or {key}=false.")
    return problems


def _number_not_bool(value) -> bool:
    """An int or float other than 0 and 1 (which a bool also accepts), and no bool itself."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value not in (0, 1)


def _compose_once(lines: list[str], bases: dict[tuple[str, ...], DictConfig | ConfigError]) -> DictConfig:
    """_compose, once per list of lines within one compose_config call (``bases``, made empty by the caller): after a
    failed compose both _constructor_arguments and _diagnose compare the overrides with the config of the group
    choices alone; a compose is ~60 ms. The result is read, never changed (_check_value_override copies it)."""
    key = tuple(lines)
    if key not in bases:
        try:
            bases[key] = _compose(lines)
        except ConfigError as e:
            bases[key] = e
    if isinstance(bases[key], ConfigError):
        raise ConfigError(bases[key].problems)
    return bases[key]


def _base_or_none(lines: list[str], bases: dict) -> DictConfig | None:
    try:
        return _compose_once(lines, bases)
    except ConfigError:
        return None


def _compose(lines: list[str]) -> DictConfig:
    try:
        return compose(config_name=CONFIG_NAME, overrides=lines)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(e)) from None
    except (HydraException, OmegaConfBaseException) as e:
        recipe = next((x.split("=", 1)[1] for x in lines if x.startswith("recipe=")), None)
        raise ConfigError(composition_problem(e, config_dir_of(lines), recipe) or first_line(e)) from None


def _table_entries(value) -> list[str]:
    """Problems of ``+tables={<name>: {<field>: v}}`` (what table_path_override makes of tables.<name>.<field>=v),
    each as the user's tables.<name>.<field>=v: a field TableConfig has not, or a value of the wrong type."""
    problems = []
    known = list(TableConfig.__dataclass_fields__)
    for name, fields in (value.items() if isinstance(value, dict) else ()):
        if not isinstance(fields, dict) and "." in name:  # tables.<name>.<not a field>=v
            table, _, leaf = name.rpartition(".")
            hint = did_you_mean(leaf, known, f"tables.{table}.")
            problems.append(f"tables.{name}={fields}: a table has no field {leaf}.{hint} Fields of a table: "
                            f"{', '.join(known)}.")
        for field, v in (fields.items() if isinstance(fields, dict) else ()):
            try:
                OmegaConf.merge(OmegaConf.structured(TableConfig), {field: v})
            except OmegaConfBaseException as e:
                problems.append(f"tables.{name}.{field}={v}: {first_line(e)}. Fields of a table: "
                                f"{', '.join(TableConfig.__dataclass_fields__)}.")
    return problems


def _check_value_override(base: DictConfig, key: str, value, line: str, delete: bool) -> list[str]:
    if key == "tables" and line.startswith("+tables=") and _table_entries(value):
        return _table_entries(value)
    if problem := mapping_without_plus(base, key, value, line, OPEN_SECTIONS):
        return [problem]
    exists = _exists(base, key)
    if not exists and not line.startswith("+"):
        return [unknown_key(key, line.split("=", 1)[-1], list(_dotted_keys(base)), "key in the config; value")]
    if delete:
        return []
    trial = base.copy()  # a value its key's type (or, for an explicit +append, its section's) refuses is named here
    try:
        OmegaConf.update(trial, key, value, merge=True, force_add=not exists)
    except OmegaConfBaseException as e:
        if not exists:
            return [f"{line}: {first_line(e)}; {key.rpartition('.')[0] or 'the config'} takes values of another "
                    f"type (docs/configuration.md)."]
        now = OmegaConf.select(base, key)
        return [section_given_value(line, key, now) or f"{line}: {first_line(e)}. Current value: {key}={now!r}; give "
                f"one of that type."]
    return []  # an append the schema forbids, Hydra reports


def _exists(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted key is in the config, also when its value is still ??? (select() treats that as absent)."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=None, throw_on_missing=False) if parent_key else cfg
    if isinstance(parent, DictConfig):
        return leaf in parent.keys()
    if isinstance(parent, ListConfig):
        return leaf.isdigit() and int(leaf) < len(parent)
    return False


def _dotted_keys(node, prefix: str = "") -> Iterator[str]:
    if isinstance(node, DictConfig):
        for k in node.keys():
            full = f"{prefix}{k}"
            yield full
            child = node._get_node(k)
            if isinstance(child, DictConfig):
                yield from _dotted_keys(child, full + ".")
    elif isinstance(node, ListConfig):
        return
