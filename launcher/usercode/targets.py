"""The user's code named by dotted paths: ``_target_`` specs (importing every nested one before anything is built)
and ``loader.collate_fn``.

Packages may run code when they are imported (tensordict, which TorchRec imports, calls ``Tensor.item()`` at import).
Inside ``with torch.device("meta")`` that code fails, so every ``_target_`` of a spec, nested ones included, is imported
first (``import_targets``) and only then is the spec built on the meta device."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")
"""Keys of a _target_ spec that are Hydra's, not the constructor's arguments."""


def locate(path: str) -> Any:
    """The object at a dotted path (``pkg.module.Class``); raises ImportError/AttributeError as Python would. A path
    that names a module (``pkg.module``, which its package need not import) is that module."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name and ".".join(parts[:cut]).startswith(e.name):
                continue  # a shorter prefix may be the module
            raise
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            if cut == len(parts) - 1 and _is_module(path):
                return importlib.import_module(path)  # the whole path is a module of the package
            raise
        return obj
    return importlib.import_module(path)


SPEC_SECTIONS = {"model": "my_project.model.Net", "data": "my_project.data.Clicks",
                 "eval_data": "my_project.data.Clicks", "val_data": "my_project.data.Clicks",
                 "loss": "torch.nn.BCEWithLogitsLoss"}
"""A user recipe's sections that are _target_ specs, each with the class an example names; eval_data and val_data
may be null (none)."""


def spec_shape_problems(sections: Mapping[str, Any], source: str) -> list[str]:
    """Each of a user recipe's ``sections`` (key -> its value as composed) that is no _target_ spec: null where one
    is needed, a string, a list or a number where a mapping is, a mapping without a ``_target_`` or with one that is
    no dotted path. Said with the form to write, before anything reads them (the one check of a section's shape:
    launcher/facts/user_code.py check_target starts with it)."""
    problems = []
    for key, node in sections.items():
        example = SPEC_SECTIONS.get(key, "my_project.Thing")
        form = f"{key}: {{_target_: <module.Class>, <its arguments>...}} (e.g. {key}: {{_target_: {example}}})"
        if node is None:
            if key in ("model", "data", "loss"):
                problems.append(f"{key} ({source}) is null: a recipe of your own needs its {key}, a mapping with a "
                                f"_target_ (the dotted path of a class) and the class's arguments: {form}.")
        elif not isinstance(node, Mapping):
            given = node if isinstance(node, str) else list(node) if isinstance(node, Sequence) else node
            shown = f"{key}: {{_target_: {node}}}" if isinstance(node, str) and "." in node else form
            problems.append(f"{key}: {given!r} ({source}) is a {type(given).__name__}, where a recipe of your own "
                            f"takes a mapping with a _target_ (the dotted path of a class) and its arguments. "
                            f"Write {shown}, or {key}._target_=<module.Class> on the command line.")
        elif "_target_" not in node:
            problems.append(f"{key} ({source}) needs a _target_: the dotted path of a class, e.g. {form}.")
        elif not (isinstance(node["_target_"], str) and node["_target_"]):
            problems.append(f"{key}._target_={node['_target_']!r} ({source}) is no dotted path: give the class's as "
                            f"a string, e.g. {key}._target_={example}.")
    return problems


def _is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):  # its parent is a module, not a package
        return False


def nested_targets(spec: Any, key: str) -> list[tuple[str, str]]:
    """(dotted key, _target_) of every spec nested in ``spec`` (not ``spec``'s own), in order."""
    found = []
    items = spec.items() if isinstance(spec, Mapping) else enumerate(spec) if isinstance(spec, list) else ()
    for k, v in items:
        here = f"{key}.{k}"
        if isinstance(v, Mapping) and isinstance(v.get("_target_"), str):
            found.append((here, v["_target_"]))
        found += nested_targets(v, here)
    return found


def import_targets(spec: Any, key: str) -> list[tuple[str, str, BaseException]]:
    """Import every ``_target_`` of ``spec`` (its own and the nested ones): (key, target, error) of each that does
    not import."""
    own = [(key, spec["_target_"])] if isinstance(spec, Mapping) and isinstance(spec.get("_target_"), str) else []
    failed = []
    for where, target in own + nested_targets(spec, key):
        try:
            locate(target)
        except Exception as e:  # noqa: BLE001 (the user's module may raise anything on import)
            failed.append((where, target, e))
    return failed


def build_collate(spec: Any) -> Callable[[list], Any] | None:
    """The collate function ``loader.collate_fn`` names (None: DataLoader's default_collate): a dotted path or
    ``{_target_: fn}`` is the function itself; ``{_target_: fn, key: value}`` binds the keyword arguments (Hydra's
    ``_partial_``); ``{_target_: Class, ...}`` builds a callable object. Raises what the import or construction
    raises, TypeError when the result cannot be called."""
    if spec is None:
        return None
    if isinstance(spec, str):
        fn = locate(spec)
    elif isinstance(spec, Mapping) and isinstance(spec.get("_target_"), str):
        target = locate(spec["_target_"])
        args = {k: v for k, v in spec.items() if k not in HYDRA_KEYS}
        if inspect.isclass(target):
            from hydra.utils import instantiate

            fn = instantiate(dict(spec), _convert_="all")
        else:
            fn = functools.partial(target, **args) if args else target
    else:
        raise TypeError(f"it is a {type(spec).__name__}; give a dotted path or {{_target_: ...}}")
    if not callable(fn):
        raise TypeError(f"{type(fn).__name__} object is not callable")
    return fn


def defined(target: str) -> str:
    """'' when the dotted ``target`` names a class or function its module defines (or imports) at top level, read
    from the module's source without importing it; else why not. A module that is no .py file is taken on trust."""
    import ast
    import importlib.util
    from pathlib import Path

    module, _, name = target.rpartition(".")
    if not module:
        return f"{target!r} is no dotted path (package.module.Class)"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return f"no module {module}"
    if not (spec.origin or "").endswith(".py"):
        return ""
    try:
        tree = ast.parse(Path(spec.origin).read_text())
    except (OSError, SyntaxError, ValueError):
        return ""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return "" if name in names else f"{module} defines no {name}"
