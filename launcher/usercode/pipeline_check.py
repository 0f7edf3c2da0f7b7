"""Before a pipeline of a user's model is planned: how its stages are cut, and its layers in forward order.

A model whose forward is its top-level children called one after the other (an ``nn.Sequential``, or written so) is
cut as a chain (launcher/parallel/pipeline_stages.py). Any other model (HF's GPT-2 and Llama, torchvision's ResNet)
is cut by torch's tracer at the first layer of each stage (launcher/parallel/pipeline_trace.py): here it is traced
once on the meta device so that a model torch.export cannot capture is refused before launch, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from launcher.errors import first_line
from launcher.usercode.items import call, move_to
from launcher.usercode.recipe import units


def forward_order(model: nn.Module, inputs: Any) -> list[str]:
    """The model's layers (``units``) in the order its forward first calls them on ``inputs`` (meta tensors); the
    layers it never calls (a head used by weight only) follow in registration order. Registration order when the
    forward does not run on the meta device."""
    layers = units(model)
    seen: list[str] = []
    hooks = [m.register_forward_pre_hook(lambda _m, _a, n=name: seen.append(n) if n not in seen else None)
             for name, m in layers]
    try:
        with torch.no_grad():
            call(model, inputs)
    except Exception:  # noqa: BLE001 - an op without a meta kernel: registration order
        seen = []
    finally:
        for h in hooks:
            h.remove()
    return seen + [n for n, _ in layers if n not in seen]


def is_chain(model: nn.Module, inputs: Any) -> bool:
    """The model's top-level children, called in order on ``inputs`` (meta), give what its forward gives (shape and
    dtype; a functional op between children that keeps the shape is not caught)."""
    children = list(model.named_children())
    if isinstance(inputs, Mapping) or [n for n, _ in children] != [n for n, _ in units(model)]:
        return False
    try:
        with torch.no_grad():
            want = model(*inputs)
            x = children[0][1](*inputs)
            for _, child in children[1:]:
                x = child(x)
    except Exception:  # noqa: BLE001
        return False
    return torch.is_tensor(x) and torch.is_tensor(want) and x.shape == want.shape and x.dtype == want.dtype


def check_pipeline(model_spec: dict[str, Any], model: nn.Module, batch: tuple[Any, Any], source: str, stages: int,
                   output: str) -> tuple[list[str], str, tuple[str, ...]]:
    """(problems, how stages are cut: chain or trace, the layers in forward order) of the user's model (built on
    meta) for ``stages`` pipeline stages, on one batch."""
    from hydra.utils import instantiate

    from launcher.parallel.pipeline_trace import trace
    from launcher.plan.pipeline import PipelinePlan, StagePlan

    inputs = move_to(batch[0], "meta")
    order = tuple(forward_order(model, inputs))
    if is_chain(model, inputs):
        return [], "chain", order
    if len(order) < 2:
        return [f"parallel.pipeline_stages={stages}: model ({source}) has one layer ({', '.join(order)}): nothing to "
                f"cut into stages. Set parallel.pipeline_stages=1."], "trace", order
    half = len(order) // 2
    probe = PipelinePlan(stages=(StagePlan(0, order[:half], 0, 1), StagePlan(1, order[half:], 0, 1)),
                         micro_batches=1, partition="uniform", split="trace")
    try:
        with torch.device("meta"):
            fresh = instantiate(model_spec, _convert_="all")
        trace(fresh, probe, inputs, output)
    except Exception as e:  # noqa: BLE001
        return [f"parallel.pipeline_stages={stages}: model ({source}) is not a chain of its top-level children, and "
                f"torch's pipeline tracer (torch.export) cannot capture its forward to cut it at a layer: "
                f"{first_line(e)}. Make its forward traceable (no data-dependent Python control flow), or write it "
                f"as its children called in order (e.g. an nn.Sequential), or set parallel.pipeline_stages=1."
                ], "trace", order
    return [], "trace", order
