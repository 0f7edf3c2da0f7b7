"""The math of the gpt recipe's data source, torch-free (the planner imports it).

The source is an order-2 Markov chain over a vocabulary of V tokens. After each context (a, b) = (x_{t-2}, x_{t-1})
the next token is one of K distinct candidates, drawn with the probabilities of one fixed *profile* p_1 >= ... >= p_K.
Which K tokens are the candidates, and which of them gets p_1, is chosen per context from the source's seed. Every
context thus has the same conditional distribution up to relabelling, so H(X_t | X_{t-2}, X_{t-1}) = H(profile)
exactly, whatever the stationary distribution.

A sequence of S tokens starts with x_0, x_1 uniform and independent; x_2..x_{S-1} follow the chain. A causal LM makes
S-1 predictions per sequence: x_1 from x_0 alone (entropy ln V, as x_1 is independent of x_0), then x_2..x_{S-1}
(entropy H(profile) each). All losses below are in nats per predicted token.
"""

import math


def profile(k: int, skew: float) -> list[float]:
    """The candidates' probabilities, a truncated Zipf law: p_i proportional to i^-skew for i = 1..k.

    skew=0 is uniform over the k candidates (entropy ln k); larger skew concentrates mass on the first candidate.
    """
    if k < 1:
        raise ValueError(f"k={k} candidates; need k >= 1.")
    weights = [(i + 1) ** -skew for i in range(k)]
    total = sum(weights)
    return [w / total for w in weights]


def entropy(p: list[float]) -> float:
    """Shannon entropy of the distribution p, in nats (terms with p_i = 0 contribute 0)."""
    return -sum(x * math.log(x) for x in p if x > 0)


def uniform_loss(vocab: int) -> float:
    """Cross-entropy of a uniform guess over vocab tokens, ln V nats: the loss of an untrained model."""
    return math.log(vocab)


def entropy_floor(vocab: int, seq_len: int, k: int, skew: float) -> float:
    """The lowest achievable mean next-token cross-entropy over a sequence of seq_len tokens, in nats per token.

    (ln V + (S - 2) * H(profile)) / (S - 1): the first prediction cannot beat ln V, the S - 2 others H(profile).
    """
    if seq_len < 3:
        raise ValueError(f"seq_len={seq_len}; the chain needs seq_len >= 3 (two seed tokens and one step).")
    return (uniform_loss(vocab) + (seq_len - 2) * entropy(profile(k, skew))) / (seq_len - 1)
