"""A rank's pipeline stages cut from the whole model (torchtitan's manual split): each stage's module is the model with
the layers of other stages removed (set to None), so its parameters and buffers keep the whole model's names.

How a stage runs (PipelinePlan.split): ``chain`` runs the stage's layers one after the other (the first takes every
input the stage gets: the batch's inputs on stage 0, the previous stage's outputs after it), which is the forward of
a sequential model; ``model`` keeps the model's own forward, which skips the layers set to None (wide_deep's). A
user's model that is no chain is cut from its forward's graph (``graph``: launcher/parallel/pipeline_graph.py) or by
torch's tracer (``trace``: launcher/parallel/pipeline_trace.py).

``stage_examples`` gives each stage the shapes and dtypes it receives and sends, from the model built on the meta
device: torch's PipelineStage takes them up front (its static mode) instead of inferring them at the first step by
running every stage's forward on uninitialised tensors, which a table lookup (garbage ids) or a BatchNorm (its
running statistics) cannot take."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from launcher.module_paths import set_module
from launcher.parallel.rank import Chunk, as_meta, layer_paths
from launcher.plan.pipeline import PipelinePlan, StagePlan


def _chain(module: nn.Module, paths: list[str]):
    """The stage's layers one after the other, each looked up at its path when it runs (a part may replace it)."""

    def forward(*args: Any) -> Any:
        layers = [module.get_submodule(p) for p in paths]
        x = layers[0](*args)
        for layer in layers[1:]:
            x = layer(x)
        return x

    return forward


def stage_chunk(module: nn.Module, paths: dict[str, str], plan: PipelinePlan, stage: StagePlan) -> Chunk:
    """``module`` (the whole model, changed in place) cut down to ``stage``."""
    for name, path in paths.items():
        if name not in stage.layers:
            set_module(module, path, None)
    kept = [(name, paths[name]) for name in stage.layers]
    if plan.split == "chain":
        module.forward = _chain(module, [p for _, p in kept])
    return Chunk(module=module, paths=kept, stage=stage.index)


def split_model(model: nn.Module, layers: list[tuple[str, nn.Module]], plan: PipelinePlan, pp_rank: int,
                rt: Any) -> list[Chunk]:
    """The chunks of pipeline rank ``pp_rank``: one per stage it runs (a copy of the model each when it runs
    several), in stage order; a ``trace`` split cuts them with torch's tracer, a ``graph`` split from the forward's
    graph."""
    if plan.split == "trace":
        from launcher.parallel.pipeline_trace import traced_chunks

        return traced_chunks(model, plan, pp_rank, rt)
    if plan.split == "graph":
        from launcher.parallel.pipeline_graph import graph_chunks

        return graph_chunks(model, plan, pp_rank, rt)
    paths = dict(layer_paths(model, layers))
    local = [s for s in plan.stages if plan.rank_of(s.index) == pp_rank]
    return [stage_chunk(model if len(local) == 1 else copy.deepcopy(model), paths, plan, s) for s in local]


def stage_examples(model_spec: dict[str, Any], layers_of: Any, plan: PipelinePlan, inputs: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> dict[int, tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """stage -> (what it receives, what it sends) for one micro-batch of ``inputs``, as meta tensors, by running the
    model built on the meta device stage after stage in the run's compute ``dtype`` (floats)."""
    from hydra.utils import instantiate

    with torch.device("meta"):
        whole = instantiate(model_spec)
    whole.to(dtype)
    paths = dict(layer_paths(whole, layers_of(whole)))
    state = tuple(as_meta(t, dtype) for t in inputs)
    out = {}
    with torch.enable_grad():
        for stage in plan.stages:
            chunk = stage_chunk(copy.deepcopy(whole), paths, plan, stage)
            sent = chunk.module(*state)
            sent = sent if isinstance(sent, tuple) else (sent,)
            out[stage.index] = (state, sent)
            state = tuple(t.detach().requires_grad_(t.requires_grad) for t in sent)
    return out


def stage_shapes(rt: Any, plan: PipelinePlan, example: Any) -> dict[int, tuple[tuple, tuple]]:
    """stage -> (what it receives, what it sends), as meta tensors, for one micro-batch like ``example``, by the
    shape run of the plan's split (as split_model cuts it)."""
    from launcher.parallel.engine import DTYPES

    dtype = DTYPES[rt.plan.precision]
    if plan.split == "trace":
        from launcher.parallel.pipeline_trace import stage_io as trace_io

        return trace_io(rt.plan.model, plan, example, rt.plan.model_output, dtype)[0]
    if plan.split == "graph":
        from launcher.parallel.pipeline_graph import stage_io

        return stage_io(rt.plan.model, plan, example, rt.plan.model_output, dtype)
    return stage_examples(rt.plan.model, rt.layers_of, plan, example, dtype)
