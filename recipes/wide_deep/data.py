"""Synthetic Criteo-shaped CTR data drawn from a known logistic model.

Continuous fields ~ N(0, 1). Categorical ids are log-uniform in [0, rows) (a few ids are frequent, most rare, as in
Criteo). The click probability is

    sigmoid(bias + w . dense + sum_f effect_f(id_f) + sum_(a,b) effect_ab(id_a, id_b))

with effect_f(id) = scale * h(seed, f, id) * (1 + id)^-decay, h uniform in [-1, 1) from an integer hash (no per-row
storage at any table size); frequent ids carry strong effects, rare ids weak ones, as in real CTR logs. A few field
pairs interact the same way. ``true_logits`` gives the exact logit, hence the Bayes AUC of any test set. Every global micro-batch is
drawn from a generator seeded by (seed, index), so the sample stream does not depend on how it is split over data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from launcher.contract import dp_share, endless_shares

_EVAL_STREAM = 1_000_003  # offset of the held-out stream's batch indices
_MASK32 = (1 << 32) - 1


def _hash_uniform(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix of int64 x (values < 2**31) to uniform floats in [0, 1)."""
    h = (x * 2654435761) & _MASK32
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & _MASK32
    h = h ^ (h >> 16)
    return h.double().div_(2.0**32).float()


class SyntheticCTR:
    def __init__(
        self,
        num_dense: int,
        num_sparse: int,
        rows_per_table: int,
        seed: int,
        effect_scale: float = 1.0,
        effect_decay: float = 0.3,
        interactions: list[list[int]] | None = None,
        interaction_scale: float = 1.0,
    ) -> None:
        self.num_dense, self.num_sparse, self.rows = num_dense, num_sparse, rows_per_table
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self.dense_weight = torch.randn(num_dense, generator=g) * 0.3
        self.bias = -1.0
        self.effect_scale, self.effect_decay = effect_scale, effect_decay
        self.interactions = [tuple(p) for p in (interactions or [])]
        self.interaction_scale = interaction_scale

    def _effect(self, key: torch.Tensor, ids: torch.Tensor, scale: float) -> torch.Tensor:
        return (2 * _hash_uniform(key & 0x7FFFFFFF) - 1) * scale * (1.0 + ids.float()).pow(-self.effect_decay)

    def true_logits(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        fields = torch.arange(self.num_sparse)
        logit = self.bias + dense @ self.dense_weight
        logit = logit + self._effect(ids * 131 + fields * 7919 + self.seed * 104729, ids, self.effect_scale).sum(dim=1)
        for k, (a, b) in enumerate(self.interactions):
            pair = ids[:, a] * self.rows + ids[:, b]
            key = pair * 613 + (k + 1) * 15485863 + self.seed * 104729
            decay_ids = (1 + ids[:, a]) * (1 + ids[:, b]) - 1
            logit = logit + self._effect(key, decay_ids, self.interaction_scale)
        return logit

    def global_micro_batch(self, index: int, rows: int, seed: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_000_007 + index)
        dense = torch.randn(rows, self.num_dense, generator=g)
        u = torch.rand(rows, self.num_sparse, generator=g)
        ids = (torch.pow(float(self.rows), u).long() - 1).clamp_(0, self.rows - 1)
        p = torch.sigmoid(self.true_logits(dense, ids))
        labels = torch.bernoulli(p, generator=g)
        return (dense, ids), labels

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[tuple]:
        return endless_shares(lambda i, rows: self.global_micro_batch(i, rows, seed), dp_rank, dp_size, micro_size, start)

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        for k in range(count):
            batch = self.global_micro_batch(_EVAL_STREAM + k, micro_size * dp_size, self.seed)
            yield dp_share(batch, dp_rank, micro_size)
