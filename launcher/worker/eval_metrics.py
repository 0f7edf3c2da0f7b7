"""Evaluation metrics over the whole held-out set (predictions gathered from every rank).

Their memory is a few bytes per held-out example (a streamed run evaluates every held-out row: its rank's memory
must not grow with them): the scores are sorted as they come (fp32), the tie groups' sums and the log loss are made
CHUNK values at a time in float64. Measured by tests/worker/test_eval_metrics.py (the peak of ``binary_metrics``
over 4 M examples); before, AUC's float64 copies, ranks and torch.unique's outputs took about 140 bytes an example.
"""

from __future__ import annotations

import torch

_EPS = 1e-7
CHUNK = 1 << 16
"""Values a float64 pass takes at a time (512 KiB a temporary, whatever the held-out set's size)."""


def _group_starts(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``scores`` sorted ascending, the order it took), and the first position of each run of equal sorted scores
    (a NaN is its own run, as it equals nothing)."""
    ordered, order = torch.sort(scores)
    fresh = torch.ones(len(ordered), dtype=torch.bool)
    torch.ne(ordered[1:], ordered[:-1], out=fresh[1:])
    return order, fresh.nonzero().squeeze(1)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative), ties counting 1/2
    (the Mann-Whitney U statistic with average ranks). nan when only one class is present.

    Exact, in about 20 bytes an example at its peak: every run of tied scores (sorted positions start .. start + c - 1)
    gives each of its p positives the run's average rank start + (c + 1) / 2, so the positives' rank sum is the sum
    over runs of p (start + (c + 1) / 2), with p from a running count of the sorted labels."""
    scores, labels = scores.detach().flatten().cpu(), labels.detach().flatten().cpu()
    scores = scores if scores.is_floating_point() else scores.double()
    n = scores.numel()
    pos = int(labels.double().sum().item())
    neg = n - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order, starts = _group_starts(scores)
    seen = torch.cumsum((labels == 1)[order], 0, dtype=torch.int32 if n < 2**31 else torch.int64)
    del order
    rank_sum = 0.0
    for first in range(0, len(starts), CHUNK):
        start = starts[first:first + CHUNK]
        end = starts[first + CHUNK:first + CHUNK + 1] if first + CHUNK < len(starts) else start.new_tensor([n])
        end = torch.cat([start[1:], end])
        before = torch.where(start > 0, seen[(start - 1).clamp(min=0)], 0).double()
        p = seen[end - 1].double() - before
        rank_sum += (p * (start.double() + (end - start + 1).double() / 2)).sum().item()
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """AUC, log loss (of sigmoid(logits)), accuracy at 0.5 and the example count; the log loss and accuracy summed
    CHUNK examples at a time in float64."""
    logits, labels = logits.detach().flatten().cpu(), labels.detach().flatten().cpu()
    n = labels.numel()
    log_sum, right = 0.0, 0
    for first in range(0, n, CHUNK):
        p = torch.sigmoid(logits[first:first + CHUNK].double()).clamp(_EPS, 1 - _EPS)
        y = labels[first:first + CHUNK].double()
        log_sum -= (y * p.log() + (1 - y) * (1 - p).log()).sum().item()
        right += int(((p > 0.5).double() == y).sum().item())
    return {"auc": auc(logits, labels), "logloss": log_sum / n if n else float("nan"),
            "accuracy": right / n if n else float("nan"), "n": int(n)}
