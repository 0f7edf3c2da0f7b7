"""MNIST-shaped digits, generated (never downloaded): 28×28 images of 10 classes, each class a fixed random stroke
pattern (seeded) under Gaussian noise, so that the network has something to learn and a held-out set to score."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class GeneratedDigits:
    def __init__(self, samples: int, eval_samples: int, side: int, classes: int, noise: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.prototypes = (torch.rand(classes, side, side, generator=g) > 0.8).float()

        def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            labels = torch.randint(classes, (n,), generator=g)
            images = self.prototypes[labels] + noise * torch.randn(n, side, side, generator=g)
            return images, labels

        self.images, self.labels = draw(samples)
        self.eval_images, self.eval_labels = draw(eval_samples)

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[tuple]:
        """DistributedSampler's order: each epoch a seeded permutation, dealt to the ranks micro-batch by micro-batch
        (global micro-batch k is the same images however many ranks share it); the last partial batch dropped."""
        group, n = micro_size * dp_size, len(self.labels)
        per_epoch = n // group
        epoch, skip = divmod(start, per_epoch)
        while True:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            for k in range(skip, per_epoch):
                idx = order[k * group + dp_rank * micro_size: k * group + (dp_rank + 1) * micro_size]
                yield (self.images[idx],), self.labels[idx]
            epoch, skip = epoch + 1, 0

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        """The whole held-out set (count is ignored), each rank every dp-th image, the same number of batches on
        every rank."""
        mine = torch.arange(dp_rank, len(self.eval_labels), dp_size)
        batches = max(1, -(-len(mine) // micro_size))
        for idx in torch.tensor_split(mine, batches):
            yield (self.eval_images[idx],), self.eval_labels[idx]
