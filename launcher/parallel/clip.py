"""trainer.grad_clip on the torch-native parts (ddp, fsdp, with tensor parallel and pipeline stages): the global L2
norm of every dense gradient of the run, clipped before each optimizer step. The deepspeed part clips by its own
``gradient_clipping`` (launcher/parallel/deepspeed.py).

The arithmetic is torch's ``clip_grad_norm_``: norm = sqrt(sum of every gradient's squares), each gradient times
min(1, max_norm / (norm + 1e-6)). What torch does not know here: a DTensor's local shard holds part of its gradient
(Shard: the squares add over the mesh dim), or all of it (Replicate: counted once); gradients are grouped by (mesh,
placements) and each group's squares summed by one DTensor ``full_tensor`` (torch's own reduction over the mesh).
With pipeline stages the squares then add over the pp group, as torchtitan's ``dist_utils.clip_grad_norm_`` does,
and a weight tied across stages (gpt's head) is counted once, in its first stage (every copy holds the same summed
gradient by then). The hook runs after every other pre-step hook (the dp average, the tied-weight sum), so it clips
what the optimizer steps. Tables trained outside the parts are not clipped (the plan says so)."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import torch
import torch.distributed as dist

from launcher.parallel.rank import local_tensor


class GradClip:
    """A pre-step hook of the optimizer: clips the chunks' gradients to ``max_norm``; ``last`` is the norm before
    clipping of the last step (a tensor on the device)."""

    def __init__(self, chunks: list[Any], max_norm: float, device: Any, pp_group: Any = None,
                 tied: tuple[Any, ...] = ()) -> None:
        skip = {id(p) for p in _later_copies(chunks, tied)}
        self.params = [p for c in chunks for p in dict.fromkeys(c.module.parameters()) if id(p) not in skip]
        self.clipped = [p for c in chunks for p in dict.fromkeys(c.module.parameters())]
        self.max_norm, self.device, self.pp_group = max_norm, device, pp_group
        self.last: torch.Tensor | None = None

    def __call__(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        norm = total_norm(self.params, self.device, self.pp_group)
        self.last = norm
        coef = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            for p in self.clipped:
                if p.grad is not None:
                    g = local_tensor(p.grad)
                    g.mul_(coef.to(g.device, g.dtype))


def total_norm(params: list[Any], device: Any, pp_group: Any = None) -> torch.Tensor:
    """The global L2 norm of the parameters' gradients (collective over their meshes, and over ``pp_group``)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    total = torch.zeros((), dtype=torch.float32, device=device)
    groups: dict[tuple[Any, tuple[Any, ...]], torch.Tensor] = {}
    with torch.no_grad():
        for p in params:
            g = p.grad
            if isinstance(p, DTensor):  # grouped by the parameter's spec: every rank of a mesh has the same groups
                key = (p.device_mesh, tuple(p.placements))
                sq = torch.zeros((), dtype=torch.float32, device=device)
                if g is not None:
                    if any(pl.is_partial() for pl in g.placements):  # its local values are summands: sum them first
                        g = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
                    sq = g.to_local().float().pow(2).sum().to(device)
                groups[key] = groups.get(key, 0) + sq
            elif g is not None:
                total += local_tensor(g).float().pow(2).sum().to(device)
        for (mesh, placements), sq in groups.items():
            summed = [Partial("sum") if pl.is_shard() else Replicate() for pl in placements]
            total += DTensor.from_local(sq, mesh, summed, run_check=False).full_tensor()
        if pp_group is not None:
            dist.all_reduce(total, group=pp_group)
    return total.sqrt()


def _later_copies(chunks: list[Any], tied: tuple[Any, ...]) -> list[Any]:
    """The copies of tied weights held by a stage other than the tie's first: their gradient is counted once."""
    out = []
    for tie in tied:
        first = min(tie.stages)
        for c in chunks:
            if c.stage == first:
                continue
            for name, path in c.paths:
                for t in tie.paths:
                    if t.startswith(name + "."):
                        with suppress(AttributeError):
                            out.append(c.module.get_parameter(f"{path}.{t[len(name) + 1:]}" if path else
                                                              t[len(name) + 1:]))
    return out


def attach_clip(engine: Any, optimizer: Any, chunks: list[Any], rt: Any, max_norm: float) -> GradClip:
    """Register the clip as the optimizer's last pre-step hook; the engine reports its norm (``grad_norm``)."""
    plan = rt.plan
    pp = getattr(plan, "dims", None) is not None and plan.dims.pp > 1
    tied = tuple(plan.pipeline.tied) if pp and plan.pipeline is not None else ()
    clip = GradClip(chunks, max_norm, rt.device, rt.mesh["pp"].get_group() if pp else None, tied)
    optimizer.register_step_pre_hook(clip)
    engine.clip = clip
    return clip
