"""A fixed random data set, reshuffled every epoch with the trainer seed and split across ranks."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class FixedRandom:
    def __init__(self, samples: int, in_features: int, out_features: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(samples, in_features, generator=g)
        self.labels = torch.randn(samples, out_features, generator=g)
        # Held-out set: the same distribution, never trained on.
        self.eval_inputs = torch.randn(samples, in_features, generator=g)
        self.eval_labels = torch.randn(samples, out_features, generator=g)

    def train_batches(self, rank: int, world_size: int, micro_size: int, seed: int) -> Iterator[tuple]:
        group = micro_size * world_size
        n = self.inputs.shape[0]
        epoch = 0
        while True:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            for start in range(0, n - group + 1, group):
                idx = order[start + rank * micro_size : start + (rank + 1) * micro_size]
                yield (self.inputs[idx],), self.labels[idx]
            epoch += 1

    def eval_batches(self, rank: int, world_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        group = micro_size * world_size
        for k in range(count):
            start = (k * group) % max(1, self.eval_inputs.shape[0] - group + 1)
            idx = slice(start + rank * micro_size, start + (rank + 1) * micro_size)
            yield (self.eval_inputs[idx],), self.eval_labels[idx]
