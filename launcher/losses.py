"""Losses that third-party models need, to name by ``_target_`` from a recipe's YAML.

    loss: {_target_: launcher.losses.TokenCrossEntropy, shift: true}   # a causal LM's next-token loss

``TokenCrossEntropy`` takes (B, S, V) logits and (B, S) integer labels, where torch's ``CrossEntropyLoss`` wants the
classes in dimension 1 (B, V, S). ``shift=true`` is a causal LM's next-token loss as HuggingFace computes it when a
model is given ``labels=input_ids``: position t's logits predict label t+1. Labels equal to ``ignore_index`` (-100,
HuggingFace's padding label) count for nothing."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class TokenCrossEntropy(nn.Module):
    def __init__(self, ignore_index: int = -100, shift: bool = False, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.ignore_index, self.shift, self.label_smoothing = ignore_index, shift, label_smoothing

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.dim() != labels.dim() + 1 or logits.shape[:-1] != labels.shape:
            raise ValueError(f"TokenCrossEntropy takes logits (..., V) and labels of the logits' shape without V: got "
                             f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)}")
        if self.shift:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1).long(),
                               ignore_index=self.ignore_index, label_smoothing=self.label_smoothing)
