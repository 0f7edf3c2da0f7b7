"""Training precision in a rank: BatchNorm computes in fp32 when the rest of the model runs in bf16 or fp16.

The parts that run bf16 cast a BatchNorm's weight to bf16 (FSDP2's MixedPrecisionPolicy leaves its buffers in fp32,
DeepSpeed casts them too), and torch's batch_norm refuses a bf16 weight beside fp32 running statistics ("expected
scalar type BFloat16 but found Float"); running statistics kept in bf16 would drift anyway. As MindSpore's amp O2 and Apex's
keep_batchnorm_fp32 do, a BatchNorm here normalises in fp32 (input, weight, bias and running statistics) and hands
its output on in the input's dtype; its gradients flow back in the parameters' dtype.

A pipeline stage cut by torch's tracer is a graph recorded once, dtypes included: it is traced with the model as the
run computes (``computing_in``: parameters in bf16 as FSDP2 casts them, buffers as they are, BatchNorm in fp32), the
fp32 master weights put back after (launcher/parallel/pipeline_trace.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _as_float(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.float() if t is not None and t.dtype != torch.float32 else t


def _batchnorm_fp32(bn: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """_BatchNorm.forward, in fp32 (its running statistics updated in place, in their own dtype)."""
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
    use_batch = bn.training or (bn.running_mean is None and bn.running_var is None)
    track = not bn.training or bn.track_running_stats
    mean, var = (_as_float(bn.running_mean), _as_float(bn.running_var)) if track else (None, None)
    y = F.batch_norm(x.float(), mean, var, _as_float(bn.weight), _as_float(bn.bias), use_batch, factor, bn.eps)
    if track and mean is not None and mean is not bn.running_mean:  # low-precision buffers: the update lands there
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
    return y.to(x.dtype)


def keep_batchnorm_fp32(model: nn.Module) -> int:
    """Make every BatchNorm of ``model`` that runs torch's own _BatchNorm.forward (BatchNorm1d/2d/3d) compute in fp32,
    in place; returns how many. A subclass with a forward of its own (SyncBatchNorm's cross-rank statistics, a
    user's) is left as it is."""
    count = 0
    for m in model.modules():
        if isinstance(m, _BatchNorm) and type(m).forward is _BatchNorm.forward:
            def forward(x: torch.Tensor, _bn: Any = m) -> torch.Tensor:
                _bn._check_input_dim(x)
                return _batchnorm_fp32(_bn, x)

            m.forward = forward
            count += 1
    return count


def as_compute_dtype(model: nn.Module, dtype: torch.dtype) -> None:
    """``model`` (built on meta for the stages' shapes) as a run in ``dtype`` computes: its floating parameters in
    ``dtype``, its buffers as they are (FSDP2's MixedPrecisionPolicy casts parameters only: a BatchNorm's running
    statistics, Llama's rotary frequencies stay fp32), every BatchNorm in fp32 (``keep_batchnorm_fp32``)."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    if dtype != torch.float32:
        keep_batchnorm_fp32(model)


@contextmanager
def computing_in(model: nn.Module, dtype: torch.dtype) -> Iterator[dict[int, torch.Tensor]]:
    """``model`` as ``as_compute_dtype`` makes it, for what runs inside (a trace records the dtypes of the run: its
    ``.to()`` calls and dtype checks); its parameters' own values (by ``id``: the fp32 master weights, exact)
    are put back after. Yields those values."""
    kept = {id(p): (p, p.data) for p in model.parameters() if p.is_floating_point()}
    try:
        as_compute_dtype(model, dtype)
        yield {k: data for k, (_, data) in kept.items()}
    finally:
        for p, data in kept.values():
            p.data = data
