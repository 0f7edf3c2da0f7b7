"""A fixed random data set, reshuffled every epoch with the trainer seed and split across data-parallel ranks."""

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

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[tuple]:
        group = micro_size * dp_size
        n = self.inputs.shape[0]
        per_epoch = n // group
        epoch, skip = divmod(start, per_epoch)
        while True:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            for k in range(skip, per_epoch):
                idx = order[k * group + dp_rank * micro_size : k * group + (dp_rank + 1) * micro_size]
                yield (self.inputs[idx],), self.labels[idx]
            epoch, skip = epoch + 1, 0

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        group = micro_size * dp_size
        for k in range(count):
            start = (k * group) % max(1, self.eval_inputs.shape[0] - group + 1)
            idx = slice(start + dp_rank * micro_size, start + (dp_rank + 1) * micro_size)
            yield (self.eval_inputs[idx],), self.eval_labels[idx]
