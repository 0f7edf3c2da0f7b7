"""GroupBatchNorm: a BatchNorm whose batch statistics span a process group (the sync_batchnorm part's module; why it
is not torch's nn.SyncBatchNorm: launcher/parallel/sync_batchnorm.py).

Per channel over the group's ranks r: N = Σ_r n_r, mean = Σ_r Σ x / N, var = Σ_r Σ (x - mean)² / N (two
all-reduces, of C + 1 and C numbers; centred before squaring, so no cancellation), y = (x - mean) / sqrt(var + eps)
· w + b. The all-reduces are autograd functions (``_GroupSum``, as torch.distributed.nn's all_reduce): the backward
sums each statistic's gradient over the group, so every rank's inputs get the gradient of the whole group's loss
through the shared statistics."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class _GroupSum(torch.autograd.Function):
    """Σ over the group's ranks; its gradient is the group's sum of the gradients (every rank's loss depends on every
    rank's share)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


class GroupBatchNorm(_BatchNorm):
    """A BatchNorm1d/2d/3d whose training statistics are the group's (its parameters and buffers those of the
    BatchNorm it replaces, ``convert``)."""

    def __init__(self, bn: _BatchNorm, group: Any) -> None:
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, device="meta")
        self.weight, self.bias = bn.weight, bn.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(name, getattr(bn, name))
        self.inner = type(bn).__name__
        self.group = group
        self.train(bn.training)

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"{self.inner} (synced over dp) expected at least 2D input (got {x.dim()}D input)")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, replaces={self.inner}, synced over the dp group"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training and self.running_mean is not None:
            return _normalise(x, self.running_mean.float(), self.running_var.float(), self)
        dims = [d for d in range(x.dim()) if d != 1]
        xf = x.float()
        count = torch.tensor([xf.numel() / xf.shape[1]], dtype=torch.float32, device=x.device)
        first = _GroupSum.apply(torch.cat([xf.sum(dims), count]), self.group)
        total = first[-1]
        mean = first[:-1] / total
        shape = [1, -1] + [1] * (x.dim() - 2)
        var = _GroupSum.apply(((xf - mean.view(shape)) ** 2).sum(dims), self.group) / total
        if self.training and self.track_running_stats:
            self._update_running(mean.detach(), var.detach(), float(total.detach()))
        return _normalise(x, mean, var, self)

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, total: float) -> None:
        """As nn.BatchNorm: an exponential (or, momentum None, cumulative) average with the unbiased variance."""
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (total / max(total - 1.0, 1.0))
        with torch.no_grad():
            self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
            self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


def _normalise(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, bn: GroupBatchNorm) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) · weight + bias, in fp32, handed on in x's dtype."""
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x.float() - mean.view(shape)) * torch.rsqrt(var.view(shape) + bn.eps)
    if bn.weight is not None:
        y = y * bn.weight.float().view(shape) + bn.bias.float().view(shape)
    return y.to(x.dtype)


def convert(module: nn.Module, group: Any) -> tuple[nn.Module, int]:
    """``module`` with every BatchNorm (BatchNorm1d/2d/3d; not one that syncs already) replaced by a GroupBatchNorm
    over ``group``, in place where it is a child; (the module, how many were replaced)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, (GroupBatchNorm, nn.SyncBatchNorm)):
        return GroupBatchNorm(module, group), 1
    count = 0
    for name, child in list(module.named_children()):
        new, n = convert(child, group)
        if new is not child:
            setattr(module, name, new)
        count += n
    return module, count
