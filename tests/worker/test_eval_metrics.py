"""AUC against its definition (all positive/negative pairs), log loss and accuracy against direct formulas."""

import math

import torch

from launcher.worker.eval_metrics import auc, binary_metrics


def pairwise_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auc_matches_pairwise_definition_with_ties():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        scores = torch.randint(0, 6, (200,), generator=g).float()  # many ties
        labels = (torch.rand(200, generator=g) < 0.3).float()
        assert math.isclose(auc(scores, labels), pairwise_auc(scores.tolist(), labels.tolist()), rel_tol=1e-12)


def test_auc_extremes():
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert auc(torch.ones(4), labels) == 0.5
    assert math.isnan(auc(torch.rand(3), torch.ones(3)))


def test_binary_metrics():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0])
    m = binary_metrics(logits, labels)
    p = torch.sigmoid(logits.double())
    expected = -(labels * p.log() + (1 - labels) * (1 - p).log()).mean().item()
    assert math.isclose(m["logloss"], expected, rel_tol=1e-12)
    assert m["accuracy"] == 0.75 and m["n"] == 4 and m["auc"] == 1.0
