"""What ``launcher.runtime.prepare()`` does to your model and optimizer, holding none of the runtime's state: the
tables found in the model, taken out of your optimizer and set to follow its param groups' lr schedule, and the model
and optimizer it hands back (they keep the names they had in launcher/runtime/__init__.py, which a script may print). The
state (``runtime._S``) and the calls a script makes (``prepare``, ``backward``, ``step``, ``log``, ...) stay in
launcher/runtime/__init__.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def tables_of(model: nn.Module) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """The model's tables (module path -> (rows, dim)) and their other names (a TorchRec table's) -> module path."""
    from launcher.facts.model import model_facts_on_meta

    facts = model_facts_on_meta(model)
    return facts.tables, dict(facts.aliases)


def group_of(optimizer: torch.optim.Optimizer, weight: torch.Tensor) -> dict | None:
    return next((g for g in optimizer.param_groups if any(p is weight for p in g["params"])), None)


def schedule_of(sparse: list, followed: dict[str, dict | None], optimizer: torch.optim.Optimizer,
                engine_groups: list[dict]) -> tuple:
    """What runtime's ``_follow_schedule`` needs: each followed table follows the group that held it, or the first group
    when that group held only tables (it left the optimizer with them)."""
    out = []
    for t in sparse:
        if t.name not in followed:
            continue
        held = followed[t.name]
        index = min(next((i for i, g in enumerate(optimizer.param_groups) if g is held), 0), len(engine_groups) - 1)
        group = engine_groups[index]
        out.append((t.name, t.lr, index, float(group.get("initial_lr", group["lr"]))))
    return tuple(out)


def drop_from_optimizer(optimizer: torch.optim.Optimizer, ids: set[int]) -> None:
    """Take the tables' weights out of the user's optimizer, in place (a scheduler made on it keeps working)."""
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) in ids:
                optimizer.state.pop(p, None)
        g["params"] = [p for p in g["params"] if id(p) not in ids]
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
    if not optimizer.param_groups:
        raise ValueError("runtime.prepare(): every parameter of the model is a table that left the engine; the "
                         "engine has nothing to train. Keep a dense part in the model, or leave the tables inside "
                         "(placement.host_device_mix=0).")


class _PreparedModel:
    """What prepare() returns for the model: call it as before; ``train()``/``eval()`` and every attribute of your
    module (``parameters()``, ``state_dict()``, your own methods) reach it through the engine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.engine(*inputs, **kwargs)

    def train(self, mode: bool = True) -> _PreparedModel:
        self.engine.train(mode)
        return self

    def eval(self) -> _PreparedModel:
        self.engine.eval()
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine.module, name)


class _PreparedOptimizer(torch.optim.Optimizer):
    """What prepare() returns for the optimizer (an ``Optimizer``, so LR schedulers take it): ``step()`` is
    ``runtime.step()`` (the engine and the tables), ``zero_grad()`` is the engine's at each step; ``param_groups``,
    ``state`` and state dicts are the engine's optimizer's (your optimizer, or DeepSpeed's wrapper of it)."""

    def __init__(self, inner: Any, step: Callable[[], None]) -> None:
        # no super().__init__: this shares inner's groups, it has none of its own; ``step`` is runtime.step
        self.optimizer = inner
        self._runtime_step = step
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return getattr(self.optimizer, "defaults", {})

    def step(self, closure=None) -> None:
        self._runtime_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)
