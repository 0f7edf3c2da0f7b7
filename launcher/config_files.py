"""The user's config folder (Hydra's ``--config-dir``) before Hydra reads it: its recipe names, each recipe file
checked as UTF-8 YAML mapping with the ``# @package _global_`` header, and a YAML error as one sentence naming the
file, line and column (Hydra's own message is a traceback of its loader)."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import yaml

from launcher.errors import ConfigError, did_you_mean, first_line


def quoted_path(path: Path) -> str:
    """A path inside a quoted Hydra override value (commas, spaces and brackets are safe there)."""
    return str(path).replace("\\", "\\\\").replace("'", "\\'")


SEARCH = "hydra.searchpath=['file://"


def search_line(config_dir: str) -> str:
    """The override that adds the user's config folder to Hydra's search path (read back by ``config_dir_of``)."""
    return f"{SEARCH}{quoted_path(Path(config_dir).resolve())}']"


def config_dir_of(lines: list[str]) -> str | None:
    """The user's config folder a ``search_line`` among ``lines`` adds, as the user would type it from here."""
    for line in lines:
        if line.startswith(SEARCH) and line.endswith("']"):
            path = line[len(SEARCH):-2].replace("\\'", "'").replace("\\\\", "\\")
            rel = os.path.relpath(path)
            return rel if not rel.startswith("..") else path
    return None


def check_recipe_file(path: Path, shown: str) -> None:
    """A recipe in the user's folder: UTF-8 text, YAML, a mapping of sections, ``# @package _global_`` first; else
    ConfigError naming the file (and the line and column of a YAML error) before Hydra reads it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{shown}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}). Save the file "
                          f"as UTF-8.") from None
    except OSError as e:
        raise ConfigError(f"{shown}: cannot be read ({e.strerror}). Make it a readable file.") from None
    header = package_header(text)
    if header != "_global_":
        raise ConfigError(f"{shown}: {_header_problem(text, header)}")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(e, shown)) from None
    if doc is not None and not isinstance(doc, dict):
        kind = {"list": "list", "str": "string"}.get(type(doc).__name__, f"single value ({doc!r})")
        raise ConfigError(f"{shown}: the file holds a {kind}, not a mapping of sections. Write it as `key: value` "
                          f"lines at the root: recipe: {{name: {path.stem}}}, model: {{_target_: ...}}, data: ..., "
                          f"loss: ....")
    if isinstance(doc, dict) and "hydra" in doc:
        from launcher.config_overrides import hydra_section

        raise ConfigError([f"{shown}: {line}" for line in hydra_section(doc["hydra"])])


def package_header(text: str) -> str | None:
    """The package a config file's header sets, read as Hydra reads it (hydra/plugins/config_source.py
    ``_get_header_dict``): its first lines that are ``# @key value`` comments, blank lines skipped, up to the first
    other line; None when they set none."""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not re.match(r"^#\s*@", line):
            return None
        words = line.lstrip("#").split()
        if len(words) == 2 and words[0] == "@package":
            return words[1]
    return None


def _header_problem(text: str, header: str | None) -> str:
    """Why a recipe file's header is not Hydra's ``# @package _global_``, and the fix."""
    need = ("(a recipe sets sections at the root of the config: model, data, loss, trainer, ...; Hydra reads the "
            "header from the file's first lines only)")
    if text.startswith("\ufeff"):
        return (f"it starts with a byte-order mark (U+FEFF, which some editors write), so Hydra does not see its first "
                f"line as `# @package _global_` {need}. Save the file as UTF-8 without BOM.")
    if header is not None:
        return f"its header sets `@package {header}`; a recipe's is `# @package _global_` {need}. Write that instead."
    if re.search(r"^\s*#\s*@package\s+_global_\s*$", text, re.M):
        return (f"`# @package _global_` is in it but not at its top, where Hydra reads it {need}: a line before it "
                f"that is no `# @...` comment ends the header. Move it to the first line.")
    return f"its first line must be `# @package _global_` {need}. Add that line."


def yaml_problem(e: yaml.YAMLError, name: str | None = None) -> str:
    """One problem sentence for a config file that is not YAML: the file (``name``, else the one PyYAML names), the
    line and column, PyYAML's reason, and a fix."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is None:  # a ReaderError (a character YAML does not allow) has no mark
        return f"{name or 'a config file'} is not valid YAML: {first_line(e)}. Fix the file (UTF-8 text, YAML syntax)."
    if name is None:
        name = str(mark.name)
        rel = os.path.relpath(name) if os.path.isabs(name) else name
        name = rel if not rel.startswith("..") else name  # as the user would type it, under the current folder
    problem = str(getattr(e, "problem", "") or "").strip() or first_line(e)
    context, start = str(getattr(e, "context", "") or "").strip(), getattr(e, "context_mark", None)
    begun = (f" ({context} begun at line {start.line + 1}, column {start.column + 1})"
             if context and start is not None and (start.line, start.column) != (mark.line, mark.column) else
             f" ({context})" if context else "")
    text = getattr(mark, "buffer", None) or ""
    line = text.split("\n")[mark.line] if mark.line < text.count("\n") + 1 else ""
    fix = ("Keep one of the two." if "duplicate key" in problem else
           "Quote the interpolation: inside { } or [ ], YAML reads ${...} as a mapping, e.g. {dim: '${model.dim}'}."
           if "${" in line else
           "Fix the file there: an unclosed [ or {, a missing comma, a tab used for indentation or an unquoted value "
           "holding ': ' are the usual causes.")
    return f"{name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}{begun}. {fix}"


def user_recipes(config_dir: str | None) -> list[str]:
    """The recipe names in the user's config dir (``<config_dir>/recipe/*.yaml``)."""
    if config_dir is None:
        return []
    root = Path(config_dir)
    if root.is_file():
        raise ConfigError(f"--config-dir {config_dir}: a file, not a folder. Give the folder that holds "
                          f"recipe/<name>.yaml, e.g. --config-dir {root.parent / 'conf' if root.suffix else 'conf'}.")
    if not root.is_dir():
        raise ConfigError(f"--config-dir {config_dir}: no such directory (relative paths start at {Path.cwd()}). "
                          f"Give the folder that holds recipe/<name>.yaml, e.g. --config-dir conf.")
    found = sorted(p.stem for p in (root / "recipe").glob("*.yaml"))
    if not found and (misplaced := _misplaced(root, config_dir)):
        raise ConfigError(f"--config-dir {config_dir}: no recipe/<name>.yaml in it, where hetero-launch reads your "
                          f"recipes; {misplaced}")
    return found


def _misplaced(root: Path, given: str) -> str:
    """Where recipes in a config dir without recipe/*.yaml are instead, and the fix ('' when none are)."""
    here = [p.name for p in sorted(root.glob("*.y*ml")) if "@package _global_" in p.read_text(errors="replace")]
    if here and root.name == "recipe":
        return (f"{', '.join(here)} lie in the recipe/ folder itself: give the folder above it, --config-dir "
                f"{root.parent}.")
    if here:
        return f"{', '.join(here)} lie in it directly: move them into {Path(given) / 'recipe'}/."
    if any((root / "recipes").glob("*.y*ml")):
        return f"it has recipes/ (plural): rename that folder to {Path(given) / 'recipe'} (Hydra's group name)."
    yml = [p.name for p in sorted((root / "recipe").glob("*.yml"))]
    if yml:
        return f"{', '.join(yml)} end in .yml: rename them to .yaml (Hydra reads .yaml files only)."
    return ""


def group_options(users: list[str], recipes: list) -> dict[str, list[str]]:
    """The options of each config group of the package's conf/ (_package_groups), the user's recipes among recipe's,
    and as data's the chosen built-in recipe's own (its data_configs) when one is chosen."""
    groups = dict(_package_groups())
    groups["recipe"] = sorted({*groups.get("recipe", []), *users})
    if len(recipes) == 1:
        groups["data"] = list(recipes[0].data_configs)
    return groups


@functools.cache
def _package_groups() -> dict[str, list[str]]:
    """The package's conf/ groups and their options (its folders of YAML files), read once per process."""
    import launcher.conf

    root = Path(launcher.conf.__path__[0])
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(root.iterdir())
            if d.is_dir() and d.name != "hydra" and not d.name.startswith("_")}


ROOT_GROUPS = ("parallel", "placement")
"""conf/config.yaml's groups after the recipe, which a run picks on the command line (placement=auto)."""


def composition_problem(error: BaseException, config_dir: str | None, recipe: str | None = None) -> str:
    """Hydra's error composing a recipe file of the user's folder ("In 'recipe/x': ConfigKeyError raised while
    composing config: ... full_key: trainer.stepz") as one sentence naming the file, the key and the fix, as the same
    mistake on the command line is said; '' when the error is not about such a file. ``recipe``: the recipe= given
    (Hydra's words for a defaults entry of a root group name no file)."""
    group = re.match(r"Multiple values for (\w+)\.", str(error))
    if group and group.group(1) in ROOT_GROUPS and config_dir and recipe:
        return _root_group(f"{config_dir}/recipe/{recipe}.yaml", group.group(1))
    found = re.match(r"In '(recipe/[^']+)': (.*)", str(error), re.S)
    if config_dir is None or not found or not (Path(config_dir) / f"{found.group(1)}.yaml").is_file():
        return ""
    shown, said = f"{config_dir}/{found.group(1)}.yaml", found.group(2)
    key = re.search(r"full_key: (\S+)", said)
    if said.startswith("ConfigKeyError") and key:
        hint = _close_key(key.group(1))
        return f"{shown}: {key.group(1)}: no such key.{hint} Correct it, or remove it from the file."
    if said.startswith("ValidationError") and key:
        why = said.split("\n")[1].strip().rstrip(".")
        return f"{shown}: {key.group(1)}: {why}. Correct the value in the file."
    if (group := re.match(r"Could not override '(\w+)'", said)) and group.group(1) in ROOT_GROUPS:
        return _root_group(shown, group.group(1))
    if missing := re.match(r"Could not (?:load|find) '([^']+)'", said):
        return (f"{shown}: its defaults list names {missing.group(1)}, which is no config file: neither "
                f"{config_dir}/{missing.group(1)}.yaml nor one of hetero-launch's own. Correct the name, or remove "
                f"the entry.")
    return f"{shown}: {said.splitlines()[0].rstrip('.')}."


def _root_group(shown: str, group: str) -> str:
    """A recipe file's defaults list naming a root group (/placement: auto): Hydra composes the root's own entry for
    it after the recipe, and refuses both ("Multiple values", "Could not override"). The fix: the command line, or
    the option's keys written in the file, shown from the option's own file."""
    import launcher.conf

    root = Path(launcher.conf.__path__[0]) / group
    options = sorted(p.stem for p in root.glob("*.yaml"))
    example = ""
    if options:
        text = (root / f"{options[0]}.yaml").read_text()
        body = yaml.safe_load(text) or {}
        if package_header(text) == group:
            body = {group: body}
        example = (f" ({group}={options[0]} sets {yaml.safe_dump(body, default_flow_style=True, width=10**6).strip()}"
                   f", which your file may hold)")
    choice = options[0] if len(options) == 1 else f"<{' | '.join(options)}>"
    return (f"{shown}: its defaults list names /{group}, which hetero-launch's root config picks after the recipe "
            f"(Hydra allows one, and no override of it from a recipe file). Remove the entry, and give "
            f"{group}={choice} on the command line, or write that option's keys in the file's body{example}.")


def _close_key(key: str) -> str:
    """' Did you mean <the schema's closest key beside it>?' ('' when none is close)."""
    from omegaconf import DictConfig, OmegaConf

    from launcher.schema import HeteroConfig

    parent, _, leaf = key.rpartition(".")
    base = OmegaConf.structured(HeteroConfig)
    node = OmegaConf.select(base, parent, default=None) if parent else base
    return did_you_mean(leaf, list(node.keys()) if isinstance(node, DictConfig) else [], f"{parent}." if parent else "")
