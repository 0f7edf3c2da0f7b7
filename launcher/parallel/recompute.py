"""recompute: activation checkpointing (MindSpore's ``cell.recompute()``) of the named layers.

Each layer runs under ``torch.utils.checkpoint`` (non-reentrant): its forward keeps only its inputs, and the backward
runs it again, replaying the RNG state, so dropout draws the same masks and the losses are the same as without.
It applies before data parallelism, as in torchtitan (an FSDP unit's recomputed forward finds its parameters
gathered), inside each pipeline stage, and on tensor-parallel layers. What it saves is estimated in the plan
(launcher/facts/activations.py) and measured in the ranks (launcher/worker/accounting.py: SavedActivations)."""

from __future__ import annotations

from typing import Any

from launcher.plan.intents import Intents
from launcher.parallel.part import Part


class Recompute(Part):  # it holds no state (its checkpoint: DCP): the parts around it checkpoint
    name = "recompute"
    slot = "recompute"

    def why(self, i: Intents) -> str:
        return f"recompute={list(i.recompute)}"

    def config(self, i: Intents) -> dict[str, Any]:
        return {"layers": list(i.recompute), "how": "torch.utils.checkpoint, non-reentrant, per layer"}

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def apply(self, chunks: list[Any], rt: Any) -> None:
        names = set(rt.config(self.name)["layers"])
        for c in chunks:
            for name, module in c.layers:
                if name in names:
                    checkpoint_forward(module)


def checkpoint_forward(module: Any) -> None:
    """Run ``module``'s forward under activation checkpointing when autograd records (in place)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    forward = module.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    module.forward = run


PART = Recompute()
