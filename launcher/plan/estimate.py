"""The memory estimate of a run (pure): what one rank holds after the parts split the model, per the parts' rules.

The pipeline gives each rank the parameters of its stages; tensor parallel takes away the shares of the operators it
splits; the data-parallel part's rule turns what is left into parameter, gradient and optimizer bytes on the host
and the device (launcher/parallel/*.py ``memory``); the tables outside the parts are added where they live. With a
pipeline, each stage is estimated and the rank's figure is its largest stage's."""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher.plan.memory import MemoryEstimate, with_tables
from launcher.plan.pipeline import PipelinePlan
from launcher.plan.placement import PlacementPlan


def _owner(path: str, layer_paths: dict[str, str]) -> str | None:
    """The layer whose module path is ``path`` or contains it (longest match)."""
    hits = [n for n, p in layer_paths.items() if path == p or path.startswith(p + ".")]
    return max(hits, key=lambda n: len(layer_paths[n])) if hits else None


def estimate_run(i: Any, dp_part: Any, placement: PlacementPlan, tp_saved: dict[str, int],
                 layer_paths: dict[str, str] | None, per_sample: dict | None, recompute: tuple[str, ...],
                 micro: int) -> tuple[MemoryEstimate, PipelinePlan | None]:
    """(the estimate per rank, the pipeline with each stage's state and activation bytes). ``tp_saved``: parameters
    tensor parallel takes from one rank, per operator path; ``layer_paths``: layer name -> module path (which stage
    holds a table or an operator). With a pipeline the host and device figures are each the busiest rank's there
(a stage with large host tables and one with a large network may be different ranks)."""
    pipeline = i.pipeline
    if pipeline is None:
        return with_tables(placement, dp_part.memory(i, placement.dense_params - sum(tp_saved.values()))), None
    paths = layer_paths or {}
    sparse = {t.name: t.rows * t.dim for t in placement.tables if t.outside}
    stages, per_rank = [], {}
    for s in pipeline.stages:
        held = set(s.layers)
        tables = {n for n in sparse if _owner(n, paths) in held or (_owner(n, paths) is None and s.index == 0)}
        saved = sum(v for op, v in tp_saved.items() if _owner(op, paths) in held)
        hosted = {m.name: m.params for m in placement.modules if _owner(m.name, paths) in held}  # its host modules
        dense = max(0, s.params - sum(sparse[n] for n in tables) - saved - sum(hosted.values()))
        est = with_tables(placement, dp_part.memory(i, dense), tables, set(hosted))
        act = None
        if per_sample:
            act = s.in_flight * sum(round((per_sample[n]["inputs"] if n in recompute else per_sample[n]["saved"])
                                          * micro) for n in s.layers)
        kinds = {k: getattr(est.host, k) + getattr(est.device, k) for k in dataclasses.asdict(est.host)}
        stages.append(dataclasses.replace(s, state_bytes=est.device.total + est.host.total, bytes=kinds,
                                          activation_bytes=act))
        r = pipeline.rank_of(s.index)  # a rank with several stages (interleaved) holds them all
        if r in per_rank:
            h, d = per_rank[r]
            per_rank[r] = (h.plus(**dataclasses.asdict(est.host)), d.plus(**dataclasses.asdict(est.device)))
        else:
            per_rank[r] = (est.host, est.device)
    host = max((hd[0] for hd in per_rank.values()), key=lambda b: b.total)  # each location's busiest rank: what
    device = max((hd[1] for hd in per_rank.values()), key=lambda b: b.total)  # one rank may need there at most
    whole = with_tables(placement, dp_part.memory(i, placement.dense_params))
    return dataclasses.replace(whole, host=host, device=device), dataclasses.replace(pipeline, stages=tuple(stages))
