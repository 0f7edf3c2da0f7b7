"""The recipe contract for a recipe that is only YAML: ``model``, ``data`` (and ``eval_data``) name the user's own
classes by ``_target_``; sizes come from the model itself (``ModelFacts``, gathered before planning)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.contract import DataFacts, Recipe

DATA_TARGET = "launcher.usercode.data.UserData"
"""The data source every rank builds around the user's Dataset(s)."""


class UserRecipe:
    """A recipe named by ``conf/recipe/<name>.yaml`` in the user's folder. Its model and data keys are the user's
    constructors' arguments (checked against their signatures in preflight, not by a schema). It has the contract's
    planning hooks (``model_spec``, ``problems``, ``layers``); its data and model facts (tables, sizes, layer names) need torch
    and the user's code, so ``launcher.facts.user_code.inspect_user_recipe`` gathers them in preflight instead of the
    torch-free ``data_facts`` / ``tables`` / ``dense_param_count`` hooks of a built-in recipe."""

    from_folder = True
    """A recipe of the user's folder (the plan reads it: a built-in recipe has no such attribute)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def model_spec(self, model: Any, facts: DataFacts) -> dict[str, Any]:
        return dict(model)

    def problems(self, model: Mapping[str, Any], data: Any, micro_group: int) -> list[str]:
        return []

    def layers(self, model: Any) -> list[tuple[str, Any]]:
        return units(model)

    @staticmethod
    def data_spec(data: Mapping[str, Any], eval_data: Mapping[str, Any] | None, data_inputs: list[str] | None = None,
                  data_label: str = "", collate_fn: Any = None, loader: dict[str, Any] | None = None,
                  val_data: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What every rank instantiates: the user's Dataset(s) inside a UserData source (with the collate function
        that batches their items, the DataLoader's settings, and how a batch splits into inputs and a label)."""
        return {"_target_": DATA_TARGET, "_recursive_": False, "train": dict(data),
                "eval": dict(eval_data) if eval_data else None, "data_inputs": list(data_inputs or []),
                "data_label": data_label, "collate_fn": collate_fn, "loader": dict(loader or {}),
                **({"val": dict(val_data)} if val_data else {})}


def units(model: Any, top: bool = True) -> list[tuple[str, Any]]:
    """A user model's layers: its top-level children, where a child that is a stack of blocks (``_is_stack``: HF's
    ``transformer.h`` and ``model.layers`` ModuleLists anywhere below; at the top level also timm's ViT ``blocks``
    and torchvision's ResNet ``layer1`` Sequentials) or holds a ModuleList is opened down to that stack's items:
    (module path, module) in registration order. A pipeline stage begins at one of them, recompute and FSDP units
    name them. A Sequential deeper down stays inside its layer (TorchRec's MLP keeps its Perceptrons). A model that
    wraps one module with layers of its own (TorchRec's ``DLRMTrain``, a model that builds a KeyedJaggedTensor and
    calls ``self.dlrm``, HF's ``*ForCausalLM`` around its ``model``) has that module's layers, through any number
    of such wrappers."""
    children = list(model.named_children())
    if top and len(children) == 1 and _is_wrapped(children[0][1]):
        name, child = children[0]
        return [(f"{name}.{n}", m) for n, m in units(child, top=True)]
    out: list[tuple[str, Any]] = []
    for name, child in children:
        if _is_stack(child, sequential=top):
            out += [(f"{name}.{n}", m) for n, m in child.named_children()]
        elif any(_is_stack(m, sequential=False) for m in child.modules()):
            out += [(f"{name}.{n}", m) for n, m in units(child, top=False)]
        else:
            out.append((name, child))
    return out


def _is_wrapped(module: Any) -> bool:
    """The one child of a wrapper is a model in its own right: below it, through any chain of single children (a
    wrapper of a wrapper: ``Outer.w = Wrapped(dlrm)``), a module of two or more children, any module but a
    Sequential of single operations (``Linear, ReLU, Linear`` stays one layer; a model of four ``Linear``s is four)."""
    items = list(module.children())
    while len(items) == 1:
        module, items = items[0], list(items[0].children())
    if len(items) < 2:
        return False
    return type(module).__name__ != "Sequential" or any(any(True for _ in m.children()) for m in items)


def _is_stack(module: Any, sequential: bool) -> bool:
    """A ModuleList of two or more modules, or (``sequential``) a Sequential of two or more blocks (modules made of
    modules: a Sequential of single operations, ``Linear, ReLU, Linear``, stays one layer)."""
    kind = type(module).__name__
    items = list(module.children()) if kind in ("ModuleList", "Sequential") else []
    if len(items) < 2:
        return False
    if kind == "ModuleList":
        return True
    return sequential and all(any(True for _ in m.children()) for m in items)


def recipe_for(name: str) -> Recipe | UserRecipe:
    """The built-in recipe called ``name``, or a UserRecipe (its YAML was found on the config search path)."""
    from launcher.recipes import RECIPES

    return RECIPES[name] if name in RECIPES else UserRecipe(name)
