"""Pipeline stages of a model that is not a chain (HF's GPT-2 and Llama keep their blocks in a ModuleList; torchvision's
ResNet flattens between two children), cut by torch.distributed.pipelining's own tracer at split points.

The plan's stages begin at module paths (``transformer.h.6``); ``pipeline(model, example, split_spec)`` traces the
forward with torch.export and splits its graph before each stage's first module. Whatever a later stage needs (the
hidden state, HF's attention mask, Llama's rotary tables, a skip connection) is sent to it; a weight two stages use
(GPT-2's head tied to its token embedding) is replicated to both, and the pipeline engine sums the copies' gradients
(the plan's ``tied``). A stage's module keeps the original parameter names (the export unflattens to the model's
module paths), so DCP checkpoints move between layouts.

The traced forward is the model's forward on positional tensors (dict items: their values in the dataset's key
order, passed as keywords) followed by ``model_output``'s choice, so the last stage sends the one tensor the loss
takes. torch's tracer gives stage 0 only the inputs it uses (``first_inputs``): it is called with every input and
takes those. Parameters a stage's graph never uses (the export leaves GPT-2's head on stage 0 as an alias of the
embedding) are removed from it. Each stage's inputs and outputs are found by tracing the model built on the meta
device the same way and running the stages one after the other. A table the plan trains outside the parts is the
model's own ``nn.Embedding`` again in its stage (the export made it a graph module), for the table store to take
out."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipeline

from launcher.module_paths import held_module, set_module
from launcher.parallel.rank import Chunk, as_meta
from launcher.plan.pipeline import PipelinePlan
from launcher.usercode.items import input_tensors, map_inputs, select_output
from launcher.parallel.precision import as_compute_dtype, computing_in


def _positional_forward(model: nn.Module, keys: tuple[str, ...], output: str) -> None:
    """Make ``model``'s forward take positional tensors (the keyword inputs ``keys`` in order, when the items are
    dicts) and return what ``output`` (model_output) selects of its output."""
    forward = model.forward

    def positional(self: nn.Module, *inputs: torch.Tensor) -> Any:
        return select_output(forward(**dict(zip(keys, inputs))) if keys else forward(*inputs), output)

    model.forward = types.MethodType(positional, model)


def trace(model: nn.Module, plan: PipelinePlan, example: Any, output: str) -> Any:
    """torch's Pipe of ``model`` split before the first layer of each stage after the first."""
    keys = tuple(example) if isinstance(example, Mapping) else ()
    _positional_forward(model, keys, output)
    spec = {s.layers[0]: SplitPoint.BEGINNING for s in plan.stages[1:]}
    pipe = pipeline(model, tuple(input_tensors(example)), split_spec=spec)
    if pipe.num_stages != len(plan.stages):
        raise RuntimeError(f"torch's tracer cut the model into {pipe.num_stages} stages where the plan has "
                           f"{len(plan.stages)} (split before {', '.join(spec)})")
    return pipe


def trace_as_run(model: nn.Module, plan: PipelinePlan, example: Any, output: str, dtype: torch.dtype) -> Any:
    """``trace`` of ``model`` in the dtypes the run computes in (``computing_in``: parameters in ``dtype``, buffers
    as they are, BatchNorm in fp32): torch.export records each ``.to()`` and dtype check as it ran, so a graph traced
    in fp32 asserts fp32 where FSDP2 hands bf16 ("Tensor dtype mismatch! Expected: Float, Got: c10::BFloat16").
    Every stage's parameters hold the model's fp32 values after (a weight the tracer copied to a second stage, GPT-2's
    tied head, is given the original's)."""
    if dtype == torch.float32:
        return trace(model, plan, example, output)
    with computing_in(model, dtype) as masters:
        pipe = trace(model, plan, example, output)
    for k in range(pipe.num_stages):
        for name, p in pipe.get_stage_module(k).named_parameters(remove_duplicate=False):
            if id(p) not in masters and p.is_floating_point():  # a copy made while tracing: from the master
                p.data = model.get_parameter(name).detach().clone()
    return pipe


def first_inputs(pipe: Any) -> list[int]:
    """Which of the model's inputs (by position in the traced forward) stage 0's module takes, in its order: torch's
    tracer gives a stage only the inputs it uses (an input no layer uses, or one a later stage takes, is not
    stage 0's; the pre-launch check refuses the latter: torch's runtime hands the inputs to stage 0 only)."""
    nodes = list(pipe.split_gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    first = next(n for n in nodes if n.op == "call_module" and n.target == "submod_pp_0")
    return [placeholders.index(a) for a in first.args]


def _taking(module: nn.Module, picks: list[int]) -> None:
    """Stage 0's module called with every input of the model takes those ``picks`` names."""
    forward = module.forward
    module.forward = lambda *inputs: forward(*(inputs[i] for i in picks))


def stage_io(model_spec: dict[str, Any], plan: PipelinePlan, example: Any, output: str,
             dtype: torch.dtype) -> tuple[dict[int, tuple[tuple, tuple]], dict[int, set[str]]]:
    """(stage -> (what it receives, what it sends), stage -> names of parameters its graph never uses), from the
    model built on the meta device in the compute ``dtype``, traced and run stage after stage (forward and
    backward) on one meta micro-batch."""
    from hydra.utils import instantiate

    with torch.device("meta"):
        whole = instantiate(model_spec)
    as_compute_dtype(whole, dtype)
    meta = map_inputs(example, lambda t: as_meta(t, dtype))
    pipe = trace(whole, plan, meta, output)
    state = tuple(input_tensors(meta))
    io, unused = {}, {}
    picks = first_inputs(pipe)
    with torch.enable_grad():
        for stage in plan.stages:
            module = pipe.get_stage_module(stage.index)
            sent = module(*(state if stage.index else [state[i] for i in picks]))
            sent = sent if isinstance(sent, tuple) else (sent,)
            floats = [t for t in sent if t.requires_grad]
            if floats:
                torch.autograd.backward(floats, [torch.ones_like(t) for t in floats])
            unused[stage.index] = {n for n, p in module.named_parameters(remove_duplicate=False)
                                   if p.requires_grad and p.grad is None}
            sent = tuple(t.contiguous() for t in sent)  # p2p buffers are made like these: dense (Llama's cos/sin is not)
            io[stage.index] = (state, sent)
            state = tuple(t.detach().requires_grad_(t.requires_grad) for t in sent)
    return io, unused


def _drop(module: nn.Module, names: set[str]) -> None:
    """Remove the parameters ``names`` (unused by the stage's graph) from ``module``."""
    for name in names:
        owner, _, leaf = name.rpartition(".")
        holder = module.get_submodule(owner) if owner else module
        holder._parameters.pop(leaf, None)


def traced_chunks(model: nn.Module, plan: PipelinePlan, pp_rank: int, rt: Any) -> list[Chunk]:
    """The chunks of pipeline rank ``pp_rank``, cut from ``model`` by the tracer, each with its stage's inputs and
    outputs (``Chunk.io``) for torch's PipelineStage."""
    from torch.distributed.pipelining._IR import _modify_graph_op_device

    from launcher.parallel.engine import DTYPES

    dtype = DTYPES[rt.plan.precision]
    io, unused = stage_io(rt.plan.model, plan, rt.example, rt.plan.model_output, dtype)
    pipe = trace_as_run(model, plan, map_inputs(rt.example, lambda t: t.cpu()), rt.plan.model_output, dtype)
    chunks = []
    for stage in plan.stages:
        if plan.rank_of(stage.index) != pp_rank:
            continue
        module = pipe.get_stage_module(stage.index)
        _drop(module, unused[stage.index])
        if rt.device.type != "cpu":  # ops the trace recorded on the CPU (an arange, a mask) run on the device
            _modify_graph_op_device(module, rt.device)
        _restore_tables(module, model, rt.plan.placement.tables)
        _dense_outputs(module)
        if stage.index == 0:
            _taking(module, first_inputs(pipe))
        held = [(n, n) for n in stage.layers if held_module(module, n) is not None]
        chunks.append(Chunk(module=module, paths=held, stage=stage.index, io=io[stage.index]))
    return chunks


def _dense_outputs(module: nn.Module) -> None:
    """The stage sends its outputs contiguous (a p2p send takes no view: Llama's cos/sin are expanded)."""
    forward = module.forward

    def dense(*args: Any) -> Any:
        out = forward(*args)
        return tuple(t.contiguous() for t in out) if isinstance(out, tuple) else out.contiguous()

    module.forward = dense


def _restore_tables(stage: nn.Module, model: nn.Module, tables: Any) -> None:
    """Put the model's own nn.Embedding back where the stage holds a planned table (the export made it a graph
    module): the table store takes it out as it does from an untraced model; the graph calls it the same way."""
    for table in tables:
        if held_module(stage, table.name) is not None:
            set_module(stage, table.name, model.get_submodule(table.name))
