"""The dense optimizer, built as a torch optimizer and handed to DeepSpeed (no JIT-built fused_adam on CPU)."""

from __future__ import annotations

import torch

from launcher.plan import OptimizerPlan


def build_optimizer(o: OptimizerPlan, params) -> torch.optim.Optimizer:
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.name == "momentum":  # MindSpore's Momentum: v = m*v + g; p -= lr*v (torch SGD with dampening 0)
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    raise ValueError(f"optimizer.name={o.name} is not known")  # the planner rejects it before launch
