"""Evaluation metrics over the whole held-out set (predictions gathered from every rank)."""

from __future__ import annotations

import torch

_EPS = 1e-7


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative), ties counting 1/2
    (the Mann-Whitney U statistic with average ranks). nan when only one class is present."""
    scores, labels = scores.double().flatten(), labels.double().flatten()
    pos = int(labels.sum().item())
    neg = labels.numel() - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=torch.float64)
    # average the ranks of tied scores
    unique, inverse, counts = torch.unique(sorted_scores, return_inverse=True, return_counts=True)
    if unique.numel() != scores.numel():
        sums = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, ranks[order])
        ranks[order] = (sums / counts)[inverse]
    rank_sum = ranks[labels == 1].sum().item()
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """AUC, log loss (of sigmoid(logits)), accuracy at 0.5 and the example count."""
    p = torch.sigmoid(logits.double()).clamp(_EPS, 1 - _EPS)
    y = labels.double()
    logloss = -(y * p.log() + (1 - y) * (1 - p).log()).mean().item()
    accuracy = ((p > 0.5).double() == y).double().mean().item()
    return {"auc": auc(logits, labels), "logloss": logloss, "accuracy": accuracy, "n": int(y.numel())}
