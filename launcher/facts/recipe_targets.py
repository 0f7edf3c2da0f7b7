"""A built-in recipe's ``model._target_`` and ``data._target_``, checked before any rank would build them.

The recipe's own classes are read from their modules' source, not imported: a dry run of a built-in recipe does not
import torch. A target you put in their place (``recipe=wide_deep model._target_=my_pkg.MyWideDeep``) is your code or a
package's, and each rank will build it with the recipe's arguments and use it the recipe's way. So it is imported here,
its constructor is checked against the arguments the ranks give it, a model is built on the meta device and must have
the tables and layers the recipe places and cuts by name, and a data class must have the methods the worker calls
(``launcher.contract.DataSource``; a function that builds the data is taken on its arguments). Each problem is refused
with exit 2, not met by every rank."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from launcher.errors import ConfigError, first_words

DATA_METHODS = ("train_batches", "eval_batches")
"""What the worker calls on the object a built-in recipe's data._target_ builds (launcher.contract.DataSource)."""


def check_names(cfg: DictConfig, recipe: str) -> None:
    """Each target names a class or function that exists: the recipe's package's own (``launcher.``) read from the
    source, any other imported (an import inside it that fails, a module only your shell's path had, stops here)."""
    from launcher.usercode.targets import defined, import_targets

    fix = (f"Give an importable class (the recipe's own is launcher.recipes.{recipe}.<module>.<Class>), or leave "
           f"{{key}}._target_ out.")
    problems = []
    for key, node in (("model", cfg.model), ("data", cfg.data)):
        target = str(node.get("_target_", ""))
        if target.startswith("launcher.") or "." not in target:
            why = defined(target)
            problems += [f"{key}._target_={target}: {why}. {fix.format(key=key)}"] if why else []
            continue
        spec = OmegaConf.to_container(node, resolve=True) if target else {}
        problems += [f"{k}._target_={t}: importing it fails with {first_words(e)}. Check the dotted path and that its "
                     f"module imports in the folder you run from. {fix.format(key=key)}"
                     for k, t, e in import_targets(spec, key)]
    if problems:
        raise ConfigError(problems)


def replaced(node: DictConfig) -> str | None:
    """The node's ``_target_`` when it is not its schema's default (the recipe's own class), else None."""
    schema = OmegaConf.get_type(node)
    target = node.get("_target_")
    return target if target and target != getattr(schema, "_target_", target) else None


def check_replaced(cfg: DictConfig, recipe: Any, data_facts: Any) -> None:
    """A target that replaces the recipe's own takes the recipe's arguments and fits the recipe's use of it."""
    from launcher.usercode.targets import locate

    problems = []
    if target := replaced(cfg.data):
        cls = locate(target)
        problems += _arguments("data", target, cls, OmegaConf.to_container(cfg.data, resolve=True), recipe.name)
        missing = [m for m in DATA_METHODS if isinstance(cls, type) and not callable(getattr(cls, m, None))]
        problems += [f"data._target_={target} has no method {', '.join(missing)}: recipe {recipe.name}'s ranks "
                     f"read their batches through them (launcher.contract.DataSource). Give a class that has them "
                     f"(a subclass of the recipe's own), or leave data._target_ out."] if missing else []
    if target := replaced(cfg.model):
        spec = recipe.model_spec(OmegaConf.to_object(cfg.model), data_facts)
        problems += (_arguments("model", target, locate(target), spec, recipe.name)
                     or _model_fits(recipe, spec, target))
    if problems:
        raise ConfigError(problems)


def _arguments(key: str, target: str, cls: Any, spec: dict, recipe: str) -> list[str]:
    """The one problem of a constructor that does not take the recipe's arguments for ``key`` (the keys of
    ``spec``): the recipe's schema fixes them, so the class must fit them, not the other way round."""
    import inspect

    from launcher.usercode.targets import HYDRA_KEYS

    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    given = [k for k in spec if k not in HYDRA_KEYS]
    free = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [] if free else [k for k in given if k not in params]
    needed = [n for n, p in params.items() if p.default is p.empty and n not in given
              and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not unknown and not needed:
        return []
    said = [f"it has no argument {', '.join(unknown)}"] if unknown else []
    said += [f"it needs {', '.join(needed)}, which the recipe does not give"] if needed else []
    return [f"{key}._target_={target} does not take recipe {recipe}'s {key} arguments ({', '.join(given)}): "
            f"{'; '.join(said)}. Give a class that takes them (a subclass of the recipe's own), or leave "
            f"{key}._target_ out; a {key} with arguments of its own goes in a recipe of your folder "
            f"(docs/your_model.md)."]


def _model_fits(recipe: Any, spec: dict, target: str) -> list[str]:
    """The model built on meta has each table the recipe names, with its (rows, dim), and the recipe's layers."""
    import warnings

    import torch
    from hydra.utils import instantiate

    fix = "Give a class that has them (a subclass of the recipe's own), or leave model._target_ out."
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = instantiate(spec, _convert_="all")
    except Exception as e:  # noqa: BLE001 - the user's constructor may raise anything
        return [f"model._target_={target}: building it with recipe {recipe.name}'s arguments fails with "
                f"{first_words(e)}. {fix}"]
    problems = []
    for name, (rows, dim) in recipe.tables(spec).items():
        weight = getattr(_submodule(model, name), "weight", None)
        if weight is None or tuple(weight.shape) != (rows, dim):
            got = "no module with a weight" if weight is None else f"a ({', '.join(map(str, weight.shape))}) weight"
            problems.append(f"model._target_={target} has {got} at {name}, where recipe {recipe.name} places a "
                            f"({rows}, {dim}) table. {fix}")
    try:
        recipe.layers(model)
    except Exception as e:  # noqa: BLE001
        problems.append(f"model._target_={target}: recipe {recipe.name} cannot find its layers on it "
                        f"({type(e).__name__}: {e}). {fix}")
    return problems


def _submodule(model: Any, path: str) -> Any:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None
