"""sync_batchnorm: every BatchNorm normalises over the global micro-batch of the data-parallel group, not each rank's
share of it (``parallel.sync_batchnorm=true``; torchvision's reference scripts' ``--sync-bn``, Lightning's
``sync_batchnorm``), so a data-parallel run computes what one process computes on the whole micro-batch.

torch's ``nn.SyncBatchNorm`` refuses tensors on the CPU ("SyncBatchNorm expected input tensor to be on GPU"; its
statistics kernels ``batch_norm_stats`` and ``batch_norm_gather_stats_with_counts`` exist for CUDA only), so each
BatchNorm here becomes a ``GroupBatchNorm`` that gathers the same statistics itself, on any device and backend: per
channel the sum and count of its inputs, then the sum of squared deviations from the global mean, each all-reduced
over the dp group by ``torch.distributed.nn.functional.all_reduce``, whose backward all-reduces the gradients as
SyncBatchNorm's does. It computes in fp32 whatever the parameters' dtype (as ``launcher/parallel/precision.py`` does
for a BatchNorm under bf16) and updates the running statistics as ``nn.BatchNorm`` does (the unbiased variance over
the global micro-batch). In evaluation it normalises with the running statistics, with no exchange.

It applies before the data-parallel part (it replaces modules the part then wraps), to the modules a rank runs:
inside a pipeline stage cut by the graph split each stage's BatchNorms sync over that stage's dp group."""

from __future__ import annotations

from typing import Any

from launcher.plan.intents import Intents
from launcher.parallel.part import Part


class SyncBatchNormPart(Part):  # checkpoint DCP: the same parameters and buffers at the same names
    name = "sync_batchnorm"
    slot = "normalization"
    dims = ("dp",)

    def problems(self, i: Intents) -> list[str]:
        if i.dims.dp == 1:
            return [f"parallel.sync_batchnorm=true: dp is 1 (world {i.dims.world_size} = pipeline_stages {i.dims.pp} × "
                    f"tp {i.dims.tp}), so every BatchNorm already sees the whole micro-batch and it would do nothing. "
                    "Set parallel.sync_batchnorm=false, or run more data-parallel ranks (cluster.nproc_per_node)."]
        if i.pipeline is not None and i.pipeline.split == "trace":
            return ["parallel.sync_batchnorm=true: the pipeline's stages are cut by torch's tracer "
                    "(split trace), whose graphs hold each BatchNorm as operations, not as a module to swap. Set "
                    "parallel.sync_batchnorm=false, or parallel.pipeline_stages=1."]
        return []

    def why(self, i: Intents) -> str:
        return "parallel.sync_batchnorm=true"

    def config(self, i: Intents) -> dict[str, Any]:
        return {"group": f"dp ({i.dims.dp} ranks)",
                "how": "each BatchNorm's batch statistics all-reduced over dp (sum and count, then squared "
                       "deviations), in fp32; gradients through them all-reduced"}

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def apply(self, chunks: list[Any], rt: Any) -> None:
        from launcher.parallel.group_batchnorm import convert

        for c in chunks:  # a model without BatchNorm and a traced split were refused before launch; a stage may
            c.module, _ = convert(c.module, rt.dp_group)  # hold none


PART = SyncBatchNormPart()
