"""Before a run that recomputes, has pipeline stages or lets the planner place it (placement.mode=auto): how many
bytes each layer keeps for the backward, estimated on the ``meta`` device.

One forward of a 2-sample batch of the model built on meta (no memory, no compute) with
``saved_tensors_hooks`` attributes every saved tensor (parameters left out) to the layer of ``layers()`` running
it, and records each layer's input bytes. Without recompute a micro-batch keeps the sum; a recomputed layer keeps
only its inputs. The plan scales the per-sample figures to the micro-batch; each rank measures the real bytes of its
first micro-batch (``rank.N/memory.json``), so the two can be compared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from launcher.usercode.items import call, move_to


def _bytes(t: Any) -> int:
    return t.numel() * t.element_size() if torch.is_tensor(t) else 0


@dataclass(frozen=True)
class Trace:
    layers: dict[str, dict[str, float]]
    """{layer: {"saved": bytes per sample, "inputs": bytes per sample}}."""
    lookups: dict[str, float]
    """{module path of an nn.Embedding / nn.EmbeddingBag: rows it looks up per sample}."""
    families: tuple[str, ...] = ()
    """Kinds of operators whose CPU kernels cost memory of their own when first run (conv: oneDNN's convolutions)."""


def estimate_activations(model: nn.Module, layers: list[tuple[str, nn.Module]], inputs: tuple,
                         samples: int, lookups: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """{layer: {"saved": bytes per sample, "inputs": bytes per sample}} of a forward of ``inputs`` (``samples``
    samples, on meta) through ``model``; ``lookups``, when given, gets the rows each embedding table of the model
    looks up per sample (its ids' count: what the memory model sizes a table's gradient rows by)."""
    params = {id(p) for p in model.parameters()}
    stack: list[str] = []
    saved = {name: 0 for name, _ in layers}
    entry = {name: 0 for name, _ in layers}
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if stack and id(t) not in params and id(base) not in params and id(base) not in seen:
            seen.add(id(base))
            saved[stack[-1]] += _bytes(base)
        return t

    handles = []
    for path, module in model.named_modules() if lookups is not None else ():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            def ids(_m, args, kwargs, _path=path):
                given = args[0] if args else kwargs.get("input")
                lookups[_path] = lookups.get(_path, 0.0) + (given.numel() / samples if given is not None else 0.0)

            handles.append(module.register_forward_pre_hook(ids, with_kwargs=True))
    for name, module in layers:
        def pre(_m, args, kwargs, _name=name):
            stack.append(_name)
            entry[_name] += sum(_bytes(a) for a in (*args, *kwargs.values()))

        def post(_m, _args, _out, _name=name):
            stack.pop()

        handles += [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            call(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return {name: {"saved": saved[name] / samples, "inputs": entry[name] / samples} for name, _ in layers}


def activation_facts(recipe, model_spec: dict, batch: tuple) -> Trace | None:
    """The per-layer estimate for a recipe's model (``model_spec``) and one batch of its data (tensors, any device);
    None when the model cannot run on meta (then only the ranks' measurement is there)."""
    from hydra.utils import instantiate

    with torch.device("meta"):
        model = instantiate(model_spec)
    inputs = move_to(batch[0], "meta")
    lookups: dict[str, float] = {}
    try:
        per_layer = estimate_activations(model, recipe.layers(model), inputs, len(batch[1]), lookups)
    except Exception:  # noqa: BLE001 - a forward meta cannot run (a data-dependent branch, a KeyedJaggedTensor)
        return None
    conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return Trace(layers=per_layer, lookups=lookups, families=("conv",) if conv else ())
