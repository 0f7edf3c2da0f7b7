"""Before a pipeline is planned: the parameters of each of the model's ``layers()``, the weights layers share and each
layer's module path, from the model built on the ``meta`` device (no memory). Pipeline stages are balanced by these
counts, and a weight two stages share is summed over them at every step (launcher/parallel/pipeline_engine.py)."""

from __future__ import annotations

from torch import nn

from launcher.parallel.rank import layer_paths


def layer_sizes(layers: list[tuple[str, nn.Module]]) -> tuple[dict[str, int], tuple[tuple[tuple[str, ...], int], ...]]:
    """({layer: parameters}, ((paths of one shared weight, its elements), ...)). A weight used by two layers counts
    in both (each stage that holds one of them stores it)."""
    counts: dict[str, int] = {}
    uses: dict[int, list[str]] = {}
    numel: dict[int, int] = {}
    for name, module in layers:
        counts[name] = sum(p.numel() for p in module.parameters())
        for path, p in module.named_parameters():
            uses.setdefault(id(p), []).append(f"{name}.{path}")
            numel[id(p)] = p.numel()
    return counts, tuple((tuple(paths), numel[key]) for key, paths in uses.items() if len(paths) > 1)


def layer_facts(recipe, model_spec: dict) -> tuple[dict[str, int], tuple[tuple[tuple[str, ...], int], ...],
                                                   dict[str, str]]:
    """``layer_sizes`` and ``layer_paths`` of a recipe's model (``model_spec``) built on meta."""
    import torch
    from hydra.utils import instantiate

    with torch.device("meta"):
        model = instantiate(model_spec)
    layers = recipe.layers(model)
    return (*layer_sizes(layers), dict(layer_paths(model, layers)))
