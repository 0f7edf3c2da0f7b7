"""Pipeline stages of a user's model cut from its top-level forward as a graph (``PipelinePlan.split == "graph"``):
for a model that is no chain of its children and that torch.export cannot capture, or whose inputs are not all
tensors (TorchRec's DLRM takes a KeyedJaggedTensor; a recommendation model keeps a skip connection past its first
stage).

``torch.fx`` traces the model's own forward with every layer (``units``: its top-level children, a ModuleList opened
to its items) as a leaf: the layers are never traced into, so they may do anything (a KeyedJaggedTensor's split, a
data-dependent branch); only the code between them is recorded. Each node of that graph is put on a stage: a layer's
call on the plan's stage of the layer, the model's inputs on stage 0, any other node (a ``torch.cat``, a ``*``, a
``.squeeze``) on the stage of its latest input (one made from the batch's inputs and constants alone, on the earliest
stage that uses it).
A stage is one ``torch.fx.GraphModule`` over the model whose inputs are the values that cross the boundary before it
and whose outputs are those that cross the boundary after it, in the graph's order: a layer's output that a later
stage needs passes through the stages between (a skip connection). The batch's inputs never cross: stage 0 takes
them as the model does (any structure), and a later stage that uses one reads it from the micro-batch it runs
(``Cut.fed``; the pipeline engine hands them over), so an input whose shape changes from one micro-batch to the next
(a 1-D bag's ids, a KeyedJaggedTensor) is never sent. What crosses a boundary must be a tensor (``sent`` says which
value is not; the pre-launch check finds the layers no stage may begin at first, launcher/facts/pipeline_cut.py).
The last stage returns what ``model_output`` selects. A stage's module holds the model's own layer modules at their
module paths, so its parameter names are the model's (a DCP checkpoint moves between layouts) and a table the plan
trains outside the parts is found at its path and swapped for a lookup as in an uncut model.

Each stage's inputs and outputs for torch's ``PipelineStage`` (its static shapes) come from running the stages one
after the other on one micro-batch: on the model built on the meta device, or, where the forward cannot run on meta
(a KeyedJaggedTensor's lengths are read as values), on the CPU with its tables built on meta and swapped for lookups
of zero rows (the tables are never made; only the dense part is built, once)."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from launcher.parallel.rank import Chunk
from launcher.plan.pipeline import PipelinePlan
from launcher.usercode.items import call, input_tensors, move_to, select_output


class BoundaryError(TypeError):
    """A value that is no tensor was to cross a stage boundary (torch's stages send each other tensors only)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.kind = name, type(value).__name__
        super().__init__(f"pipeline stage boundary: {name} is a {self.kind}, not a tensor, and a stage sends the next "
                         f"one tensors only. Begin the next stage elsewhere (parallel.stages) so that {name} is made "
                         f"and used on one stage, or set parallel.pipeline_stages=1")


def sent(names: tuple[str, ...], *values: Any) -> tuple[torch.Tensor, ...]:
    """A stage's outputs (the values crossing its boundary, called ``names`` in the graph), dense for the p2p send;
    BoundaryError for one that is not a tensor."""
    for name, v in zip(names, values):
        if not torch.is_tensor(v):
            raise BoundaryError(name, v)
    return tuple(v.contiguous() for v in values)


class _UnitTracer(fx.Tracer):
    """Records the forward with the layers (and any module inside one) as leaves, and traces through the modules that
    hold layers (GPT-2's ``transformer``)."""

    def __init__(self, units: set[str]) -> None:
        super().__init__()
        self.units = units

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if _unit_of(qualname, self.units) is not None:
            return True
        if any(u.startswith(qualname + ".") for u in self.units):
            return False
        return super().is_leaf_module(m, qualname)


def _unit_of(target: str, units: set[str] | dict[str, Any]) -> str | None:
    """The layer a module or attribute path (``towers.0.item_emb``, ``fc.weight``) belongs to, or None."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in units:
            return ".".join(parts[:cut])
    return None


def trace_forward(model: nn.Module, inputs: Any, units: list[str]) -> fx.Graph:
    """The model's top-level forward as a graph over its layers (``units``, leaves), called with ``inputs`` (a tuple:
    its first positional parameters; a dict: keyword inputs); the parameters the batch does not give keep their
    defaults (fx's concrete_args). Raises what torch.fx raises on a forward it cannot record."""
    params = list(inspect.signature(model.forward).parameters.values())
    given = set(inputs) if isinstance(inputs, Mapping) else {p.name for p in params[:len(inputs)]}
    concrete = {p.name: p.default for p in params
                if p.name not in given and p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL,
                                                                                       p.VAR_KEYWORD)}
    return _UnitTracer(set(units)).trace(model, concrete_args=concrete or None)


def unit_order(graph: fx.Graph, units: list[str]) -> list[str]:
    """The layers in the order the forward first calls them; those it never calls follow in ``units``' order."""
    seen: list[str] = []
    for n in graph.nodes:
        if n.op == "call_module" and (u := _unit_of(n.target, set(units))) is not None and u not in seen:
            seen.append(u)
    return seen + [u for u in units if u not in seen]


@dataclass
class Cut:
    """A forward graph cut into stages."""

    graph: fx.Graph
    stage: dict[str, int]
    """node name -> its stage."""
    unit: dict[str, str]
    """node name -> the layer it calls (or whose attribute it reads)."""
    live: list[list[str]]
    """boundary b (after stage b) -> the nodes whose values cross it, in graph order: stage b + 1's inputs."""
    stages: int
    fed: list[list[str]] = field(default_factory=list)
    """stage k -> the model inputs (graph inputs the batch gives) its nodes use after stage 0, in graph order: read
    from the micro-batch after the values received, never sent (empty for stage 0, which takes them all)."""

    def node(self, name: str) -> fx.Node:
        return next(n for n in self.graph.nodes if n.name == name)

    def backward_edges(self) -> list[tuple[fx.Node, fx.Node]]:
        """(node, input) where the node runs on an earlier stage than its input is made (a layer called again after a
        later stage's layer, or called out of the plan's order)."""
        return [(n, i) for n in self.graph.nodes for i in n.all_input_nodes if self.stage[i.name] > self.stage[n.name]]


def cut_graph(graph: fx.Graph, unit_stage: dict[str, int], stages: int, fed: frozenset[str] = frozenset()) -> Cut:
    """Each node's stage (module docstring) and what crosses each boundary; the graph inputs named in ``fed`` (those
    the batch gives) never cross: each stage that uses one reads it from the micro-batch."""
    nodes = list(graph.nodes)
    stage: dict[str, int] = {}
    unit: dict[str, str] = {}
    floating: set[str] = set()
    for n in nodes:
        owner = _unit_of(n.target, unit_stage) if n.op in ("call_module", "get_attr") else None
        if n.op == "placeholder":
            stage[n.name] = 0
        elif n.op == "output":
            stage[n.name] = stages - 1
        elif owner is not None:
            unit[n.name], stage[n.name] = owner, unit_stage[owner]
        else:
            fixed = [stage[i.name] for i in n.all_input_nodes if i.name not in floating and i.name not in fed]
            if fixed:
                stage[n.name] = max(fixed)
            else:
                floating.add(n.name)
    for n in reversed(nodes):  # a constant on the earliest stage that uses it (its users are placed by now)
        if n.name in floating:
            stage[n.name] = min((stage[u.name] for u in n.users), default=0)
    live = [[n.name for n in nodes if n.op != "output" and n.name not in fed and stage[n.name] <= b
             and any(stage[u.name] > b for u in n.users)] for b in range(stages - 1)]
    used = [[n.name for n in nodes if n.name in fed and any(stage[u.name] == k for u in n.users)] if k else []
            for k in range(stages)]
    return Cut(graph=graph, stage=stage, unit=unit, live=live, stages=stages, fed=used)


def batch_inputs(graph: fx.Graph, inputs: Any) -> dict[str, int]:
    """graph input name -> its position in the batch's inputs (``input_tensors``: positional, or a dict's values in
    its key order), for the forward's inputs the batch gives."""
    nodes = [n for n in graph.nodes if n.op == "placeholder"]
    if isinstance(inputs, Mapping):
        keys = list(inputs)
        return {n.name: keys.index(n.target) for n in nodes if n.target in inputs}
    return {n.name: i for i, n in enumerate(nodes[:len(inputs)])}


def stage_graph(cut: Cut, k: int, output: str) -> fx.Graph:
    """Stage ``k``'s graph: the model's inputs (stage 0) or the values crossing the boundary before it, its nodes,
    and the values crossing the boundary after it (through ``sent``) or, on the last stage, what ``output``
    (model_output) selects of the model's output."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    nodes = list(cut.graph.nodes)
    if k == 0:
        for n in nodes:
            if n.op == "placeholder":
                env[n] = g.node_copy(n, env.__getitem__)
    else:
        for name in (*cut.live[k - 1], *cut.fed[k]):
            env[cut.node(name)] = g.placeholder(name)
    for n in nodes:
        if n.op not in ("placeholder", "output") and cut.stage[n.name] == k:
            env[n] = g.node_copy(n, env.__getitem__)
    if k == cut.stages - 1:
        result = fx.map_arg(next(n for n in nodes if n.op == "output").args[0], env.__getitem__)
        g.output(g.call_function(select_output, (result, output)))
    else:
        names = tuple(cut.live[k])
        g.output(g.call_function(sent, (names, *(env[cut.node(n)] for n in names))))
    g.lint()
    return g


def _put(root: nn.Module, path: str, module: nn.Module) -> None:
    """``module`` at ``path`` in ``root``, making the modules above it where ``root`` has none."""
    *parents, leaf = path.split(".")
    node = root
    for p in parents:
        if p not in node._modules or node._modules[p] is None:
            node.add_module(p, nn.Module())
        node = node._modules[p]
    node.add_module(leaf, module)


def stage_module(model: nn.Module, cut: Cut, k: int, layers: tuple[str, ...], output: str) -> fx.GraphModule:
    """Stage ``k`` of ``model``: its graph over the model's own modules, each of its ``layers`` whole at its module
    path (a layer the forward reaches into, ``towers.0.item_emb``, keeps its other modules)."""
    module = fx.GraphModule(model, stage_graph(cut, k, output), class_name=f"{type(model).__name__}Stage{k}")
    for name in layers:
        _put(module, name, model.get_submodule(name))
    return module


def _positional(module: nn.Module, keys: tuple[str, ...]) -> None:
    """Stage 0 of a model called with keyword inputs takes their values in the batch's key order (what the pipeline
    engine passes: ``input_tensors``)."""
    forward = module.forward
    module.forward = lambda *values: forward(**dict(zip(keys, values)))


def cut_model(model: nn.Module, plan: PipelinePlan, inputs: Any) -> Cut:
    """``model``'s forward traced on ``inputs`` and cut at the plan's stages (the batch's inputs fed, not sent)."""
    layers = [name for s in plan.stages for name in s.layers]
    unit_stage = {name: s.index for s in plan.stages for name in s.layers}
    graph = trace_forward(model, inputs, layers)
    return cut_graph(graph, unit_stage, len(plan.stages), frozenset(batch_inputs(graph, inputs)))


def fed_positions(cut: Cut, k: int, inputs: Any) -> tuple[int, ...]:
    """The positions in the batch's inputs of what stage ``k`` reads from the micro-batch (``Cut.fed``)."""
    where = batch_inputs(cut.graph, inputs)
    return tuple(where[name] for name in cut.fed[k])


def graph_chunks(model: nn.Module, plan: PipelinePlan, pp_rank: int, rt: Any) -> list[Chunk]:
    """The chunks of pipeline rank ``pp_rank``, cut from ``model``'s forward graph, each with its stage's inputs and
    outputs (``Chunk.io``) for torch's PipelineStage. A rank that runs several stages gives each a copy of the model
    (a weight two of them share is then held, and stepped, once per stage as the plan's ``tied`` says)."""
    from launcher.parallel.engine import DTYPES

    io = stage_io(rt.plan.model, plan, rt.example, rt.plan.model_output, DTYPES[rt.plan.precision])
    local = [s for s in plan.stages if plan.rank_of(s.index) == pp_rank]
    keys = tuple(rt.example) if isinstance(rt.example, Mapping) else ()
    chunks = []
    for stage in local:
        source = model if len(local) == 1 else copy.deepcopy(model)
        cut = cut_model(source, plan, rt.example)
        module = stage_module(source, cut, stage.index, stage.layers, rt.plan.model_output)
        if stage.index == 0 and keys:
            _positional(module, keys)
        chunks.append(Chunk(module=module, paths=[(n, n) for n in stage.layers], stage=stage.index,
                            io=io[stage.index], fed=fed_positions(cut, stage.index, rt.example)))
    return chunks


def _graph_args(graph: fx.Graph, inputs: Any) -> list[Any]:
    """The forward graph's inputs, in its order, for ``inputs`` (positional or keyword); defaults where not given."""
    nodes = [n for n in graph.nodes if n.op == "placeholder"]
    if isinstance(inputs, Mapping):
        return [inputs[n.target] if n.target in inputs else n.args[0] for n in nodes]
    return [*inputs, *(n.args[0] for n in nodes[len(inputs):])]


def value_kinds(model: nn.Module, inputs: Any, units: list[str]) -> tuple[fx.Graph, dict[str, str]]:
    """``model``'s forward graph and the kind of each of its values on ``inputs``: '' for a tensor, else its type's
    name (a KeyedJaggedTensor, a tuple), from one forward through the graph (no gradient)."""
    graph = trace_forward(model, inputs, units)
    kinds: dict[str, str] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            kinds[n.name] = "" if torch.is_tensor(value) else type(value).__name__
            return value

    with torch.no_grad():
        Recorder(fx.GraphModule(model, graph)).run(*_graph_args(graph, inputs))
    return graph, kinds


# -- the stages' shapes ----------------------------------------------------------------------------------------------
class ZeroTables:
    """The table store of a shape run: zero rows of each table's width, in the run's dtype, requiring a gradient
    where the table's weight does (a lookup's rows do in a run: the stage that gets them sends their gradient back)."""

    def __init__(self, widths: dict[str, tuple[int, bool]], dtype: torch.dtype) -> None:
        self.widths, self.dtype = widths, dtype
        self.tables: dict[str, Any] = {}

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        dim, grad = self.widths[name]
        return torch.zeros(*ids.shape, dim, dtype=self.dtype, device=ids.device, requires_grad=grad)


def swap_meta_tables(model: nn.Module, dtype: torch.dtype) -> None:
    """Every nn.Embedding / nn.EmbeddingBag of ``model`` whose weight is on meta (``tables_on_meta``) swapped for a
    lookup into ZeroTables, in place."""
    from launcher.module_paths import set_module
    from launcher.tables.lookup import lookup_for

    found = {path: m for path, m in model.named_modules()
             if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.weight.is_meta}
    store = ZeroTables({p: (m.embedding_dim, m.weight.requires_grad) for p, m in found.items()}, dtype)
    for path, m in found.items():
        set_module(model, path, lookup_for(store, path, m))


def build_for_shapes(spec: dict[str, Any], device: str, dtype: torch.dtype) -> nn.Module:
    """The model of ``spec`` for a shape run: all of it on meta, or on the CPU with its tables on meta and swapped for
    zero rows; floats in ``dtype``."""
    from hydra.utils import instantiate

    from launcher.usercode.forward_check import tables_on_meta

    if device == "meta":
        with torch.device("meta"):
            model = instantiate(spec)
    else:
        with tables_on_meta():
            model = instantiate(spec)
        swap_meta_tables(model, dtype)
    return model.to(dtype)


def run_stages(model: nn.Module, plan: PipelinePlan, inputs: Any, output: str) -> list[tuple[tuple, tuple]]:
    """(what each stage receives, what it sends) when ``model``'s stages run one after the other on ``inputs``
    (forward only, gradients recorded so that each value says whether it needs one back)."""
    cut = cut_model(model, plan, inputs)
    state: Any = inputs
    given = input_tensors(inputs)
    out = []
    with torch.enable_grad():
        for stage in plan.stages:
            module = stage_module(model, cut, stage.index, stage.layers, output)
            fed = [given[i] for i in fed_positions(cut, stage.index, inputs)]
            got = call(module, state) if stage.index == 0 else module(*state, *fed)
            got = got if isinstance(got, tuple) else (got,)
            out.append((tuple(input_tensors(state)) if stage.index == 0 else state, got))
            state = tuple(t.detach().requires_grad_(t.requires_grad) for t in got)
    return out


def _as_meta(t: Any, dtype: torch.dtype) -> Any:
    if not torch.is_tensor(t):
        return t
    return t.to("meta", dtype=dtype if t.is_floating_point() else t.dtype)


def stage_runs(model_spec: dict[str, Any], plan: PipelinePlan, example: Any, output: str,
               dtype: torch.dtype) -> list[tuple[tuple, tuple]]:
    """run_stages on one micro-batch like ``example``: on the model built on meta, or, where the forward cannot run on
    meta, on the CPU with its tables on meta (module docstring). BoundaryError as run_stages raises it. The global
    RNG is left as it was (every rank built its model from the seed; a one-process run draws nothing here)."""
    with torch.random.fork_rng(devices=[]):
        try:
            model = build_for_shapes(model_spec, "meta", dtype)
            return run_stages(model, plan, move_to(example, "meta", dtype), output)
        except BoundaryError:
            raise
        except Exception:  # noqa: BLE001 - an op without a meta kernel, a value read (a KJT's lengths): the CPU
            pass
        model = build_for_shapes(model_spec, "cpu", dtype)
        return run_stages(model, plan, move_to(example, "cpu", dtype), output)


def stage_io(model_spec: dict[str, Any], plan: PipelinePlan, example: Any, output: str,
             dtype: torch.dtype) -> dict[int, tuple[tuple, tuple]]:
    """stage -> (what it receives, what it sends), as meta tensors, for one micro-batch like ``example``
    (``stage_runs``)."""
    runs = stage_runs(model_spec, plan, example, output, dtype)
    return {s.index: (tuple(_as_meta(t, dtype) for t in received), tuple(_as_meta(t, dtype) for t in got))
            for s, (received, got) in zip(plan.stages, runs)}
