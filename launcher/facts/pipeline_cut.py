"""Before a pipeline of a user's model is planned: how its stages are cut, its layers in forward order, and where no
stage may begin.

A model whose forward is its top-level children called one after the other (an ``nn.Sequential``, or written so) is
cut as a chain (launcher/parallel/pipeline_stages.py). Any other model is cut from its forward's graph, recorded by
torch.fx with its layers as leaves (``graph``: launcher/parallel/pipeline_graph.py): here the forward runs once through
that graph on a batch of two items (on meta; on the CPU, its tables never made, where meta cannot run it), and a layer
where a stage would have to be sent a value that is no tensor (a KeyedJaggedTensor a later layer takes), or where a
layer before it takes a value made after it, is one no stage may begin at (``ModelFacts.uncuttable``): the plan's
partition cuts elsewhere, and ``parallel.stages`` naming it is refused with the value, the layer and a cut that works
(launcher/plan/pipeline.py). A forward fx cannot record (HuggingFace's GPT-2 and Llama) is cut by torch's tracer
(``trace``: launcher/parallel/pipeline_trace.py), traced once here on the meta device so that a model torch.export
cannot capture, one whose inputs are not all tensors, or one whose input only a later stage takes is refused with the
reason."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from launcher.errors import first_line
from launcher.usercode.forward_check import CPU_CHECK_PARAMS
from launcher.usercode.items import all_tensors, call, input_tensors, move_to
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


def recorded(model: nn.Module, inputs: Any) -> tuple[fx.Graph | None, str]:
    """(the model's forward as a graph over its layers, '') or (None, why torch.fx cannot record it)."""
    from launcher.parallel.pipeline_graph import trace_forward

    try:
        return trace_forward(model, inputs, [n for n, _ in units(model)]), ""
    except Exception as e:  # noqa: BLE001 - fx raises TraceError, TypeError, ValueError, ...
        return None, first_line(e)


def check_pipeline(model_spec: dict[str, Any], model: nn.Module, batch: tuple[Any, Any], source: str, parallel: Any,
                   output: str, facts: Any,
                   precision: str = "fp32") -> tuple[list[str], str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(problems, how stages are cut: chain, graph or trace, the layers in forward order, the layers no stage may
    begin at with why) of the user's model (built on meta) for ``parallel``'s pipeline (pipeline_stages, stages,
    partition, stages_per_rank), on one batch; ``facts``: the model's ModelFacts (its dense size; layer parameters and
    tied weights for the stages torch's tracer is checked with); ``precision``: the run's, which torch's tracer
    records as the ranks will."""
    stages = parallel.pipeline_stages
    inputs = move_to(batch[0], "meta")
    graph, why = recorded(model, inputs)
    names = [n for n, _ in units(model)]
    if graph is not None:
        from launcher.parallel.pipeline_graph import unit_order

        order = tuple(unit_order(graph, names))
    else:
        order = tuple(forward_order(model, inputs))
    if is_chain(model, inputs):
        return [], "chain", order, ()
    split = "graph" if graph is not None else "trace"
    if len(order) < 2:
        return [f"parallel.pipeline_stages={stages}: model ({source}) has one layer ({', '.join(order)}): nothing to "
                f"cut into stages. Set parallel.pipeline_stages=1."], split, order, ()
    if graph is not None:
        return [], split, order, uncuttable(model_spec, graph, batch[0], order, facts)
    if not all_tensors(batch[0]):
        kinds = ", ".join(type(v).__name__ for v in input_tensors(batch[0]) if not torch.is_tensor(v))
        return [f"parallel.pipeline_stages={stages}: model ({source}) is not a chain of its top-level children, "
                f"torch.fx cannot record its forward with its layers as leaves ({why}), and torch's pipeline tracer "
                f"takes tensor inputs only, not a {kinds}. Make the code between its layers recordable by torch.fx "
                f"(no Python branch on a tensor's values or shapes outside its layers), or set "
                f"parallel.pipeline_stages=1."], split, order, ()
    plan = _planned(parallel, order, facts)
    problems = _trace_problems(model_spec, plan, order, inputs, source, stages, output, why, precision)
    return problems, split, order, ()


def with_outside(model: nn.Module, batch: Any, order: tuple[str, ...], layer_params: dict[str, int]) -> dict[str, int]:
    """``layer_params`` with the parameters no layer holds (a ViT's ``cls_token`` and ``pos_embed``, on the model
    itself) counted in the layer whose stage holds them: a graph split runs the code that reads one on the stage of
    the latest layer its use is computed from (launcher/parallel/pipeline_graph.py ``cut_graph``); the first layer
    where that is not known (the forward is not recorded by torch.fx: torch's tracer cuts it)."""
    from launcher.parallel.pipeline_graph import cut_graph

    inside = {id(p) for n in order for p in model.get_submodule(n).parameters()}
    outside = {name: p.numel() for name, p in model.named_parameters() if id(p) not in inside}
    if not outside or not order:
        return layer_params
    graph, _ = recorded(model, move_to(batch[0], "meta"))
    owner = {name: order[0] for name in outside}
    if graph is not None:
        cut = cut_graph(graph, {n: 0 for n in order}, 1)
        rank = {n: i for i, n in enumerate(order)}
        for node in graph.nodes:
            if node.op == "get_attr" and node.target in outside and node.users:
                made = [_layer_made(cut, u) or order[0] for u in node.users]
                owner[node.target] = min(made, key=rank.__getitem__)
    out = dict(layer_params)
    for name, count in outside.items():
        out[owner[name]] += count
    return out


def uncuttable(model_spec: dict[str, Any], graph: fx.Graph, inputs: Any, order: tuple[str, ...],
               facts: Any) -> tuple[tuple[str, str], ...]:
    """(layer, why) of each layer no stage of a graph split may begin at: a value that is no tensor would cross that
    boundary (pipeline stages send each other tensors only), or a layer before it takes a value made from it on (a
    layer called again). Which values are tensors comes from one forward through the graph on ``inputs``: on meta, or
    on the CPU with its tables never made when meta cannot run it and its dense part is small; else only the batch's
    own inputs are known (the other values are taken for tensors, and a rank shaping its stages says otherwise)."""
    from launcher.parallel.pipeline_graph import batch_inputs, cut_graph

    found, kinds = _kinds(model_spec, inputs, list(order), facts.dense_params <= CPU_CHECK_PARAMS)
    if found is not None:
        graph = found
    else:
        kinds = {name: "" if torch.is_tensor(v) else type(v).__name__ for name, v in _placeholders(graph, inputs)}
    fed = frozenset(batch_inputs(graph, inputs))  # the batch's inputs never cross: each stage reads them
    out = []
    for i in range(1, len(order)):
        cut = cut_graph(graph, {n: int(j >= i) for j, n in enumerate(order)}, 2, fed)
        bad = [n for n in cut.live[0] if kinds.get(n)]
        if bad:
            node = cut.node(bad[0])
            layer = _needed_by(cut, node)
            out.append((order[i], f"{_what(cut, node)} (a {kinds[bad[0]]}) would cross into it from the stage "
                                  f"before, to {f'layer {layer}' if layer else 'the model output'}"))
        elif edges := cut.backward_edges():
            node, made = edges[0]
            layer = cut.unit.get(node.name) or _layer_made(cut, node) or node.name
            out.append((order[i], f"layer {layer}, before it, takes {_what(cut, made)}, made from it on (a layer "
                                  f"called again later in the forward)"))
    return tuple(out)


def _kinds(model_spec: dict[str, Any], inputs: Any, units: list[str],
           cpu: bool) -> tuple[fx.Graph | None, dict[str, str]]:
    """value_kinds on the model built for a shape run (meta; the CPU, tables never made, when ``cpu``); (None, {})
    when it runs on neither."""
    from launcher.parallel.pipeline_graph import build_for_shapes, value_kinds

    with torch.random.fork_rng(devices=[]):
        for device in ("meta", "cpu") if cpu else ("meta",):
            try:
                return value_kinds(build_for_shapes(model_spec, device, torch.float32), move_to(inputs, device), units)
            except Exception:  # noqa: BLE001 - meta: an op without a kernel, a value read; the CPU: the rank says
                continue
    return None, {}


def _planned(parallel: Any, order: tuple[str, ...], facts: Any) -> Any:
    """The stages the plan will cut (launcher/plan/pipeline.py), or None when it cannot (it says why itself)."""
    from launcher.plan.pipeline import plan_pipeline

    if facts is None or facts.layer_params is None:
        return None
    plan, problems = plan_pipeline(parallel.pipeline_stages, 1, dict(parallel.stages), parallel.partition, order,
                                   facts.layer_params, facts.tied, "gpipe", parallel.stages_per_rank)
    return plan if not problems else None


def _trace_problems(model_spec: dict[str, Any], plan: Any, order: tuple[str, ...], inputs: Any, source: str,
                    stages: int, output: str, why: str, precision: str = "fp32") -> list[str]:
    """A model cut by torch's tracer: it captures the forward in the run's ``precision`` (as the ranks trace it:
    launcher/parallel/pipeline_trace.py trace_as_run), and the batch's inputs are all taken by stage 0 (its runtime
    hands them to the first stage only)."""
    from hydra.utils import instantiate

    from launcher.parallel.engine import DTYPES
    from launcher.parallel.pipeline_trace import trace
    from launcher.plan.pipeline import PipelinePlan, StagePlan
    from launcher.parallel.precision import as_compute_dtype

    if plan is None:
        half = len(order) // 2
        plan = PipelinePlan(stages=(StagePlan(0, order[:half], 0, 1), StagePlan(1, order[half:], 0, 1)),
                            micro_batches=1, partition="uniform")
    try:
        with torch.device("meta"):
            fresh = instantiate(model_spec, _convert_="all")
        names = list(inputs) if isinstance(inputs, Mapping) else list(inspect.signature(fresh.forward).parameters)
        dtype = DTYPES.get(precision, torch.float32)  # an unknown precision: the config's own check names it
        as_compute_dtype(fresh, dtype)
        pipe = trace(fresh, plan, move_to(inputs, "meta", dtype), output)
    except Exception as e:  # noqa: BLE001
        how = f" in precision={precision} (the ranks trace it as they compute)" if precision != "fp32" else ""
        other = ", or precision=fp32" if precision != "fp32" else ""
        return [f"parallel.pipeline_stages={stages}: model ({source}) is not a chain of its top-level children, "
                f"torch.fx cannot record its forward with its layers as leaves ({why}), and torch's pipeline tracer "
                f"(torch.export) cannot capture it{how} to cut it at a layer: {first_line(e)}. Make its forward "
                f"traceable (no data-dependent Python control flow), or write it as its children called in order "
                f"(e.g. an nn.Sequential), or set parallel.pipeline_stages=1{other}."]
    placeholders = [n for n in pipe.split_gm.graph.nodes if n.op == "placeholder"]
    late = [(names[i], int(u.target.rsplit("_", 1)[1])) for i, n in enumerate(placeholders) for u in n.users
            if u.op == "call_module" and u.target != "submod_pp_0"]
    if not late:
        return []
    name, k = late[0]
    return [f"parallel.pipeline_stages={stages}: model ({source}) is cut by torch's pipeline tracer (torch.fx cannot "
            f"record its forward: {why}), which hands the batch's inputs to stage 0 only, and input {name} is first "
            f"needed on stage {k} (from layer {plan.stages[k].layers[0]} on). Begin stage {k} after the layer that "
            f"takes {name}, or set parallel.pipeline_stages=1."]


def _placeholders(graph: fx.Graph, inputs: Any) -> list[tuple[str, Any]]:
    """(graph input name, the batch's value) of the forward's inputs the batch gives (``batch_inputs``)."""
    from launcher.parallel.pipeline_graph import batch_inputs

    given = input_tensors(inputs)
    return [(name, given[i]) for name, i in batch_inputs(graph, inputs).items()]


def _layer_made(cut: Any, node: fx.Node) -> str | None:
    """The layer whose output ``node`` is, or the latest layer it is computed from (None: from the inputs alone)."""
    if node.name in cut.unit:
        return cut.unit[node.name]
    index = {n.name: i for i, n in enumerate(cut.graph.nodes)}
    seen, todo, found = set(), list(node.all_input_nodes), []
    while todo:
        n = todo.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        if n.name in cut.unit:
            found.append(n)
        else:
            todo += n.all_input_nodes
    return cut.unit[max(found, key=lambda n: index[n.name]).name] if found else None


def _what(cut: Any, node: fx.Node) -> str:
    if node.op == "placeholder":
        return f"input {node.target}"
    if node.name in cut.unit:
        return f"the output of layer {cut.unit[node.name]}"
    layer = _layer_made(cut, node)
    return f"{node.name} (computed from {f'layer {layer}' if layer else 'the inputs'})"


def _needed_by(cut: Any, node: fx.Node) -> str | None:
    """The layer of a later stage that takes ``node``'s value (first in the graph), None when only the model's output
    does."""
    todo = [u for u in node.users if cut.stage[u.name] > cut.stage[node.name]]
    seen: set[str] = set()
    while todo:
        n = todo.pop(0)
        if n.name in cut.unit:
            return cut.unit[n.name]
        if n.name not in seen:
            seen.add(n.name)
            todo += list(n.users)
    return None
