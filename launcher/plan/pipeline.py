"""Pipeline stages from intent (pure): which of the model's ``layers()`` each stage runs, what each stage holds, and
how much of a step the schedule idles.

Stages come from ``parallel.stages``: the layer each stage begins at (``{transformer.h.6: 1}``; MindSpore's form,
``{head: 0, layer1: 0, ..., fc: 1}`` with every layer named, reads the same; stage numbers in layer order), or, when it is empty, from ``parallel.partition``: ``parameters`` (contiguous
stages with the largest stage's parameter count as small as it can be, what DeepSpeed's ``partition_method=
"parameters"`` aims at) or ``uniform`` (the same number of layers per stage). There are P × V stages: V
(``parallel.stages_per_rank``) per pipeline rank with the interleaved schedule, stage s on pipeline rank s mod P.
GPipe and 1F1B run M micro-batches per step through P stages, each idling (P-1) of the M+P-1 slots of a step (the
bubble); interleaved 1F1B cuts each slot V ways: (P-1)/(V·M+P-1)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import did_you_mean
from launcher.plan.registry import unknown

PARTITIONS = ("parameters", "uniform")
SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")
SPLITS = ("chain", "model", "graph", "trace")
"""How a stage runs its layers: chain (the layers one after the other, the first taking every input: the forward of
a sequential model), model (the model's own forward, which skips the layers another stage holds, set to None:
torchtitan's manual split), graph (the model's top-level forward recorded by torch.fx with its layers as leaves, each
stage a graph over its own layers: the code between layers may be anything fx records, the inputs anything, e.g. a
KeyedJaggedTensor) or trace (torch.distributed.pipelining's tracer cuts the model's traced forward before each
stage's first layer: a model fx cannot record and torch.export captures, e.g. HuggingFace's GPT-2)."""


@dataclass(frozen=True)
class StagePlan:
    index: int
    layers: tuple[str, ...]
    """Names from the recipe's layers(), in forward order."""
    params: int
    """Parameters this stage holds (a weight tied across stages counts on each stage that holds it)."""
    in_flight: int
    """Micro-batches whose activations this stage keeps at once: M under GPipe, min(P - rank, M) under 1F1B, the
    warm-up's share of its rank under interleaved 1F1B."""
    state_bytes: int = 0
    """Estimated bytes of its parameters, gradients, optimizer states, tables and table states, per rank."""
    bytes: dict[str, int] | None = None
    """The same by kind (params, grads, optimizer, tables, table_states), host and device together."""
    activation_bytes: int | None = None
    """Estimated bytes of the activations it keeps for the backward (in_flight micro-batches, recompute applied);
    None when not estimated."""


@dataclass(frozen=True)
class TiePlan:
    """One weight that layers on different stages share (e.g. GPT's head tied to its token embedding)."""

    paths: tuple[str, ...]
    """``<layer>.<attribute path>`` of each use."""
    stages: tuple[int, ...]
    """The stages holding a copy; their gradients are summed before each optimizer step."""
    numel: int


@dataclass(frozen=True)
class PipelinePlan:
    stages: tuple[StagePlan, ...]
    micro_batches: int
    """M: micro-batches per optimizer step."""
    partition: str
    """How the stages were chosen: parallel.stages, parameters or uniform."""
    tied: tuple[TiePlan, ...] = ()
    schedule: str = "1f1b"
    ranks: int = 1
    """P: pipeline ranks (the mesh's pp dim); len(stages) = P × stages_per_rank."""
    split: str = "chain"
    """How a stage runs its layers (SPLITS)."""

    @property
    def stages_per_rank(self) -> int:
        return len(self.stages) // self.ranks

    def rank_of(self, stage: int) -> int:
        """The pipeline rank (pp coordinate) that runs ``stage`` (looped: stage s on rank s mod P)."""
        return stage % self.ranks

    @property
    def bubble(self) -> float:
        """The share of a step each rank idles: (P-1)/(V·M+P-1)."""
        p, v = self.ranks, self.stages_per_rank
        return (p - 1) / (v * self.micro_batches + p - 1)


def _balanced(weights: list[int], parts: int, allowed: set[int] | None = None) -> list[int]:
    """Start index of each of ``parts`` contiguous non-empty parts of ``weights`` whose largest sum is smallest
    (exact, by dynamic programming over the cut points; ties go to the earliest cut); only ``allowed`` indices may
    start a part after the first (None: any)."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: the smallest max part sum splitting weights[:i] into k parts; cut[k][i]: where part k starts
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                if k > 1 and allowed is not None and j not in allowed:
                    continue
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def _uniform(n: int, parts: int, allowed: set[int] | None = None) -> list[int]:
    """Start indices of ``parts`` contiguous parts of n layers, sizes differing by at most one (larger ones last,
    as DeepSpeed's partition_uniform); with ``allowed`` start indices, the parts whose largest layer count is
    smallest among those cuts."""
    if allowed is not None:
        return _balanced([1] * n, parts, allowed)
    base, extra = divmod(n, parts)
    sizes = [base + (1 if k >= parts - extra else 0) for k in range(parts)]
    return [sum(sizes[:k]) for k in range(parts)]


def _first_inside(name: str, layers: tuple[str, ...]) -> str:
    """A stack's name (``blocks``, ``layer3``: its items are the layers ``blocks.0``, ...) for its first layer."""
    return name if name in layers else next((n for n in layers if n.startswith(name + ".")), name)


def _from_yaml(stages: dict[str, int], layers: tuple[str, ...], pp: int) -> tuple[list[int], list[str]]:
    """Stage of each layer from parallel.stages, and the problems (unknown layer, out of range, out of order, empty
    stage). Each named layer begins its stage: the layers after it up to the next named one run on the same stage,
    those before the first named one on stage 0 (MindSpore's form, every layer named, reads the same)."""
    problems = []
    stages = {_first_inside(name, layers): s for name, s in stages.items()}
    for name, s in stages.items():
        if name not in layers:
            hint = did_you_mean(name, layers)
            shown = ", ".join(layers[:24]) + (f", … ({len(layers)} in all)" if len(layers) > 24 else "")
            problems.append(f"parallel.stages: the model has no layer {name}.{hint} Its layers, in forward order: "
                            f"{shown}.")
        elif not (isinstance(s, int) and 0 <= s < pp):
            problems.append(f"parallel.stages.{name}={s} must be a stage number from 0 to {pp - 1} ({pp} stages: "
                            f"parallel.pipeline_stages × parallel.stages_per_rank).")
    if problems:
        return [], problems
    order, current, named = [], 0, []
    for n in layers:
        if n in stages:
            if stages[n] < current:
                problems.append(f"parallel.stages: layer {n} is on stage {stages[n]} after {named[-1]} on stage "
                                f"{current}; stages must follow the forward order (each stage a run of consecutive "
                                f"layers).")
            current = stages[n]
            named.append(n)
        order.append(current)
    empty = sorted(set(range(pp)) - set(order))
    if empty and not problems:
        problems.append(f"parallel.stages puts no layer on stage {', '.join(map(str, empty))} of the {pp} stages. "
                        f"Name the layer each stage begins at (e.g. parallel.stages={{{layers[len(layers) // 2]}: 1}}) "
                        f"or lower parallel.pipeline_stages.")
    return order, problems


def _in_flight(schedule: str, ranks: int, per_rank: int, micro: int, stage: int) -> int:
    """Micro-batches whose activations ``stage`` keeps at once (an estimate for the interleaved schedule: its
    rank's warm-up forwards, (P - r - 1)·2 + (V - 1)·P + 1 as Megatron counts them, shared by its V stages)."""
    r = stage % ranks
    if schedule == "gpipe":
        return micro
    if schedule == "interleaved_1f1b":
        warmup = min(micro * per_rank, (ranks - r - 1) * 2 + (per_rank - 1) * ranks + 1)
        return min(micro, -(-warmup // per_rank))
    return min(ranks - r, micro)


def _cut_problems(order: list[int], layers: tuple[str, ...], uncuttable: dict[str, str]) -> list[str]:
    """parallel.stages begins a stage at a layer no stage may begin at (``uncuttable``: layer -> why)."""
    problems = []
    for i in range(1, len(layers)):
        if order[i] != order[i - 1] and layers[i] in uncuttable:
            fine = [n for n in layers[1:] if n not in uncuttable]
            where = (f"Begin stage {order[i]} where only tensors cross: at {', '.join(fine[:8])}"
                     f"{' …' if len(fine) > 8 else ''} ('+parallel.stages={{{fine[0]}: {order[i]}}}'), or"
                     if fine else "No layer of it can begin a stage:")
            problems.append(f"parallel.stages: stage {order[i]} cannot begin at layer {layers[i]}: "
                            f"{uncuttable[layers[i]]}, and pipeline stages send each other tensors only. {where} "
                            f"set parallel.pipeline_stages=1.")
    return problems


def plan_pipeline(pp: int, micro_batches: int, stages: dict[str, int], partition: str, layers: tuple[str, ...],
                  layer_params: dict[str, int], tied: tuple[tuple[tuple[str, ...], int], ...],
                  schedule: str = "1f1b", per_rank: int = 1, split: str = "chain",
                  uncuttable: tuple[tuple[str, str], ...] = ()) -> tuple[PipelinePlan | None, list[str]]:
    """The stages of a pipeline over ``layers`` (with their parameter counts and the weights they share: (paths,
    numel) each) on ``pp`` ranks with ``per_rank`` stages each, or the problems. ``uncuttable``: (layer, why) of the
    layers no stage may begin at (a graph split would send a value that is no tensor there)."""
    ranks, pp = pp, pp * per_rank
    total = f"parallel.pipeline_stages={ranks}" + (f" × stages_per_rank={per_rank}" if per_rank > 1 else "")
    if len(layers) < pp:
        return None, [f"{total} needs at least {pp} layers; the model has {len(layers)} "
                      f"({', '.join(layers) or 'none'}). Lower parallel.pipeline_stages."]
    barred = dict(uncuttable)
    allowed = {i for i, n in enumerate(layers) if i and n not in barred} if barred else None
    if stages:
        order, problems = _from_yaml(dict(stages), layers, pp)
        problems = problems or _cut_problems(order, layers, barred)
        if problems:
            return None, problems
        how = "parallel.stages"
    elif partition not in PARTITIONS:
        return None, partition_problems(partition)
    elif allowed is not None and len(allowed) < pp - 1:
        shown = "; ".join(f"not at {n}: {why}" for n, why in uncuttable[:3])
        return None, [f"{total} needs {pp - 1} places to cut the model into stages; it can begin a stage only at "
                      f"{', '.join(layers[i] for i in sorted(allowed)) or 'none of its layers'} (pipeline stages "
                      f"send each other tensors only: {shown}). Lower parallel.pipeline_stages."]
    else:
        starts = (_balanced([layer_params[n] for n in layers], pp, allowed) if partition == "parameters"
                  else _uniform(len(layers), pp, allowed))
        order = [sum(1 for s in starts[1:] if i >= s) for i in range(len(layers))]
        how = partition
    stage_of = dict(zip(layers, order))
    ties = []
    for paths, numel in tied:
        held = tuple(sorted({stage_of[_layer_of(p, layers)] for p in paths}))
        if len(held) > 1:
            ties.append(TiePlan(paths=tuple(paths), stages=held, numel=numel))
    plans = []
    for s in range(pp):
        names = tuple(n for n in layers if stage_of[n] == s)
        count = sum(layer_params[n] for n in names)
        for paths, numel in tied:  # a weight two layers of this stage share is held once
            uses = sum(1 for p in paths if stage_of[_layer_of(p, layers)] == s)
            count -= numel * max(0, uses - 1)
        plans.append(StagePlan(index=s, layers=names, params=count,
                               in_flight=_in_flight(schedule, ranks, per_rank, micro_batches, s)))
    return PipelinePlan(stages=tuple(plans), micro_batches=micro_batches, partition=how, tied=tuple(ties),
                        schedule=schedule, ranks=ranks, split=split), []


def schedule_problems(schedule: str, per_rank: int, ranks: int, micro: int) -> list[str]:
    """parallel.schedule is one of SCHEDULES and fits parallel.stages_per_rank and the micro-batches (checked
    whether or not a pipeline uses it)."""
    if schedule not in SCHEDULES:
        return [unknown("parallel.schedule", schedule, SCHEDULES)]
    if per_rank < 1:
        return [f"parallel.stages_per_rank={per_rank} must be >= 1."]
    if per_rank > 1 and ranks <= 1:
        return [f"parallel.stages_per_rank={per_rank} splits each pipeline rank's part into stages; this run has no "
                f"pipeline (parallel.pipeline_stages={ranks}), so it would do nothing. Set parallel.pipeline_stages=2 "
                f"(or more) with parallel.schedule=interleaved_1f1b, or remove parallel.stages_per_rank."]
    if schedule == "interleaved_1f1b" and ranks > 1:
        if per_rank < 2:
            return [f"parallel.schedule=interleaved_1f1b runs several stages per pipeline rank; "
                    f"parallel.stages_per_rank={per_rank}. Set parallel.stages_per_rank=2 (or more), or "
                    f"parallel.schedule=1f1b."]
        rounds = max(1, micro // ranks)
        if micro > 0 and micro % rounds:
            return [f"batch.micro_batches={micro} with parallel.schedule=interleaved_1f1b on {ranks} pipeline ranks: "
                    f"torch's schedule runs the micro-batches in rounds of {ranks} and needs {micro} to be a multiple "
                    f"of {rounds} rounds. Set batch.micro_batches={rounds * ranks}."]
    elif per_rank != 1 and ranks > 1:
        return [f"parallel.stages_per_rank={per_rank} with parallel.schedule={schedule}: only interleaved_1f1b runs "
                f"several stages per rank. Set parallel.schedule=interleaved_1f1b, or parallel.stages_per_rank=1."]
    return []


def partition_problems(partition: str) -> list[str]:
    """parallel.partition is one of PARTITIONS (checked whether or not a pipeline uses it)."""
    return [] if partition in PARTITIONS else [unknown("parallel.partition", partition, PARTITIONS)]


def _layer_of(path: str, layers: tuple[str, ...]) -> str:
    """The layer a parameter path (``block.0.mlp.0.weight``) belongs to: the longest layer name it starts with."""
    return max((n for n in layers if path.startswith(n + ".")), key=len)
