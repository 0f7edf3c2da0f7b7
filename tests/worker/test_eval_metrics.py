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


def test_auc_matches_pairwise_definition_over_many_chunks_of_tie_runs(monkeypatch):
    """Runs of tied scores cut across the float64 passes' chunks (CHUNK made small), NaN-free fp32 and fp64 scores,
    labels of any float type: the rank sums still add up to the pairwise definition."""
    from launcher.worker import eval_metrics

    monkeypatch.setattr(eval_metrics, "CHUNK", 7)
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        scores = (torch.randint(0, 40, (300,), generator=g) / 8).to(dtype)
        labels = (torch.rand(300, generator=g) < 0.4).to(torch.float64)
        expected = pairwise_auc(scores.tolist(), labels.tolist())
        assert math.isclose(auc(scores, labels), expected, rel_tol=1e-12)
        m = binary_metrics(scores, labels)
        p = torch.sigmoid(scores.double()).clamp(1e-7, 1 - 1e-7)
        assert math.isclose(m["logloss"], -(labels * p.log() + (1 - labels) * (1 - p).log()).mean().item(),
                            rel_tol=1e-12)
        assert m["accuracy"] == ((p > 0.5).double() == labels).double().mean().item() and m["n"] == 300


def test_metrics_of_4m_examples_peak_at_a_few_dozen_bytes_an_example(tmp_path):
    """A streamed run evaluates every held-out row: binary_metrics over 4 M examples (fp32 logits and labels, as the
    eval gathers them; continuous scores, so nearly every score its own tie run) raises a fresh process's peak RSS by
    at most 40 bytes an example beyond its inputs' 8 (it was about 140)."""
    import subprocess
    import sys

    code = (
        "import resource, torch\n"
        "from launcher.worker.eval_metrics import binary_metrics\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(4_000_000, generator=g); y = (torch.rand(4_000_000, generator=g) < 0.25).float()\n"
        "binary_metrics(x[:1000], y[:1000])\n"  # the ops' first-call allocations, before the peak is read
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "m = binary_metrics(x, y)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / 4e6, m['auc'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}).stdout.split()
    per_example, value = float(out[0]), float(out[1])
    assert per_example <= 40, f"{per_example:.1f} bytes an example"
    assert abs(value - 0.5) < 0.01  # random scores
