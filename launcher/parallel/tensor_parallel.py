"""tensor_parallel: operators sharded over the mesh's tp dim with torch DTensor (parallel.tp / parallel.sharding).

The plan (launcher/plan/sharding.py) decided each operator's strategy, shapes and collectives; a rank applies it to
the operators its chunk holds (launcher/parallel/_dtensor.py): torch's ``parallelize_module`` with ``ColwiseParallel``
/ ``RowwiseParallel`` for a recipe's tensor-parallel plan, DTensor parameters placed per strategy for op-level
sharding. Parameters keep their names and their global shapes, so a checkpoint (DCP) saved with tp 2 loads with tp 1.
The ranks of a tp group see the same data; tables outside the parts are replicated over them."""

from __future__ import annotations

from typing import Any

from launcher.plan.intents import Intents
from launcher.parallel.part import Part

SPLIT = ("colwise", "rowwise", "row", "col")
"""Styles whose weight is split over tp (the others replicate it)."""


class TensorParallel(Part):
    name = "tensor_parallel"
    slot = "tensor_parallel"
    dims = ("tp",)

    def why(self, i: Intents) -> str:
        return f"{i.layout_words[0]}: DTensor operators over tp {i.dims.tp}"

    def config(self, i: Intents) -> dict[str, Any]:
        sh = i.sharding
        return {"source": sh.source, "tp": sh.tp, "operators": [f"{op.name} ({op.style})" for op in sh.ops]}

    def saved_params(self, i: Intents) -> dict[str, int]:
        """Per operator (module path): the parameters one rank does not hold because tp split them."""
        out = {}
        for op in i.sharding.ops:
            if op.style not in SPLIT:
                continue
            w_in, w_out = op.global_shapes["w"]
            whole = w_in * w_out + (w_out if op.style in ("colwise", "col") else 0)
            out[op.name] = whole - whole // i.dims.tp
        return out

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def apply(self, chunks: list[Any], rt: Any) -> None:
        from launcher.parallel._dtensor import shard_model

        for c in chunks:
            shard_model(c.module, rt.plan.sharding, rt.mesh["tp"])


PART = TensorParallel()
