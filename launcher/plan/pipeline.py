"""Pipeline stages from intent (pure): which of the model's ``layers()`` each stage runs, what each stage holds, and
how much of a step the schedule idles.

Stages come from ``parallel.stages`` in MindSpore's form (``{head: 0, layer1: 0, ..., fc: 1}``: every layer named,
stage numbers in layer order), or, when it is empty, from ``parallel.partition``: ``parameters`` (contiguous
stages with the largest stage's parameter count as small as it can be, what DeepSpeed's ``partition_method=
"parameters"`` aims at) or ``uniform`` (the same number of layers per stage). DeepSpeed's 1F1B schedule runs M
micro-batches per step through P stages; each stage idles (P-1) of the M+P-1 slots of a step: the bubble fraction.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

PARTITIONS = ("parameters", "uniform")


@dataclass(frozen=True)
class StagePlan:
    index: int
    layers: tuple[str, ...]
    """Names from the recipe's layers(), in forward order."""
    params: int
    """Parameters this stage holds (a weight tied across stages counts on each stage that holds it)."""
    in_flight: int
    """Micro-batches whose activations this stage keeps at once under 1F1B: min(P - index, M)."""
    state_bytes: int = 0
    """Estimated bytes of its parameters, gradients and optimizer states, per rank."""
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
    """M: micro-batches per optimizer step (DeepSpeed's gradient_accumulation_steps)."""
    partition: str
    """How the stages were chosen: parallel.stages, parameters or uniform."""
    tied: tuple[TiePlan, ...] = ()

    @classmethod
    def from_dict(cls, d: dict) -> PipelinePlan:
        return cls(stages=tuple(StagePlan(**{**s, "layers": tuple(s["layers"])}) for s in d["stages"]),
                   micro_batches=d["micro_batches"], partition=d["partition"],
                   tied=tuple(TiePlan(paths=tuple(t["paths"]), stages=tuple(t["stages"]), numel=t["numel"])
                              for t in d["tied"]))

    @property
    def bubble(self) -> float:
        """(P-1)/(M+P-1): the share of a step each stage idles under 1F1B."""
        p = len(self.stages)
        return (p - 1) / (self.micro_batches + p - 1)


def _balanced(weights: list[int], parts: int) -> list[int]:
    """Start index of each of ``parts`` contiguous non-empty parts of ``weights`` whose largest sum is smallest
    (exact, by dynamic programming over the cut points; ties go to the earliest cut)."""
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
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def _uniform(n: int, parts: int) -> list[int]:
    """Start indices of ``parts`` contiguous parts of n layers, sizes differing by at most one (larger ones last,
    as DeepSpeed's partition_uniform)."""
    base, extra = divmod(n, parts)
    sizes = [base + (1 if k >= parts - extra else 0) for k in range(parts)]
    return [sum(sizes[:k]) for k in range(parts)]


def _from_yaml(stages: dict[str, int], layers: tuple[str, ...], pp: int) -> tuple[list[int], list[str]]:
    """Stage of each layer from parallel.stages, and the problems (unknown layer, missing layer, out of range, out of
    order, empty stage)."""
    problems = []
    for name, s in stages.items():
        if name not in layers:
            close = difflib.get_close_matches(name, layers, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            problems.append(f"parallel.stages: the model has no layer {name}.{hint} Its layers: {', '.join(layers)}.")
        elif not (isinstance(s, int) and 0 <= s < pp):
            problems.append(f"parallel.stages.{name}={s} must be a stage number from 0 to {pp - 1} "
                            f"(parallel.pipeline_stages={pp}).")
    missing = [n for n in layers if n not in stages]
    if missing:
        problems.append(f"parallel.stages names no stage for {', '.join(missing)}: give every layer a stage "
                        f"(or leave parallel.stages empty for parallel.partition to choose).")
    if problems:
        return [], problems
    order = [stages[n] for n in layers]
    for a, b, (na, nb) in zip(order, order[1:], zip(layers, layers[1:])):
        if b < a:
            problems.append(f"parallel.stages: layer {nb} is on stage {b} after {na} on stage {a}; stages must follow "
                            f"the forward order (each stage a run of consecutive layers).")
    empty = sorted(set(range(pp)) - set(order))
    if empty:
        problems.append(f"parallel.stages puts no layer on stage {', '.join(map(str, empty))} of "
                        f"parallel.pipeline_stages={pp}. Give every stage a layer or lower pipeline_stages.")
    return order, problems


def plan_pipeline(pp: int, micro_batches: int, stages: dict[str, int], partition: str, layers: tuple[str, ...],
                  layer_params: dict[str, int], tied: tuple[tuple[tuple[str, ...], int], ...]
                  ) -> tuple[PipelinePlan | None, list[str]]:
    """The stages of a ``pp``-stage pipeline over ``layers`` (with their parameter counts and the weights they share:
    (paths, numel) each), or the problems."""
    if len(layers) < pp:
        return None, [f"parallel.pipeline_stages={pp} needs at least {pp} layers; the model has {len(layers)} "
                      f"({', '.join(layers) or 'none'}). Lower parallel.pipeline_stages."]
    if stages:
        order, problems = _from_yaml(dict(stages), layers, pp)
        if problems:
            return None, problems
        how = "parallel.stages"
    elif partition not in PARTITIONS:
        return None, partition_problems(partition)
    else:
        starts = (_balanced([layer_params[n] for n in layers], pp) if partition == "parameters"
                  else _uniform(len(layers), pp))
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
        plans.append(StagePlan(index=s, layers=names, params=count, in_flight=min(pp - s, micro_batches)))
    return PipelinePlan(stages=tuple(plans), micro_batches=micro_batches, partition=how, tied=tuple(ties)), []


def partition_problems(partition: str) -> list[str]:
    """parallel.partition is one of PARTITIONS (checked whether or not a pipeline uses it)."""
    if partition in PARTITIONS:
        return []
    close = difflib.get_close_matches(partition, PARTITIONS, n=1)
    hint = f" Did you mean parallel.partition={close[0]}?" if close else ""
    return [f"parallel.partition={partition} is not one of {', '.join(PARTITIONS)}.{hint}"]


def _layer_of(path: str, layers: tuple[str, ...]) -> str:
    """The layer a parameter path (``block.0.mlp.0.weight``) belongs to: the longest layer name it starts with."""
    return max((n for n in layers if path.startswith(n + ".")), key=len)
