"""Synthetic images with a learnable signal: each class has a fixed smooth random pattern; a sample is its class's
pattern times a random contrast, plus noise. Every global micro-batch is drawn from a generator seeded by
(seed, index), so the stream does not depend on how it is split over data-parallel ranks."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from launcher.contract import dp_share, endless_shares

_EVAL_STREAM = 1_000_003  # offset of the held-out stream's batch indices


class SyntheticImages:
    def __init__(self, classes: int, image_size: int, channels: int, noise: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        coarse = torch.randn(classes, channels, 4, 4, generator=g)  # smooth patterns: upsampled 4x4 noise
        self.patterns = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False)
        self.classes, self.noise, self.seed = classes, noise, seed

    def global_micro_batch(self, index: int, rows: int, seed: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_000_007 + index)
        labels = torch.randint(0, self.classes, (rows,), generator=g)
        contrast = 0.5 + torch.rand(rows, 1, 1, 1, generator=g)
        images = self.patterns[labels] * contrast + self.noise * torch.randn(rows, *self.patterns.shape[1:], generator=g)
        return (images,), labels

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[tuple]:
        return endless_shares(lambda i, rows: self.global_micro_batch(i, rows, seed), dp_rank, dp_size, micro_size, start)

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        for k in range(count):
            yield dp_share(self.global_micro_batch(_EVAL_STREAM + k, micro_size * dp_size, self.seed), dp_rank,
                           micro_size)


class SyntheticImageDataset(Dataset):
    """The same class patterns as a map-style Dataset of ``samples`` images, for a recipe of yours that names an image
    model and no data code (torchvision's ``resnet18``, a timm ViT): item i is ``(image, label)``, the image
    ``channels`` × ``image_size`` × ``image_size`` floats. ``split_seed`` draws the items (another one for held-out
    data)."""

    def __init__(self, classes: int = 10, image_size: int = 32, samples: int = 1024, channels: int = 3,
                 noise: float = 1.0, seed: int = 0, split_seed: int = 0) -> None:
        source = SyntheticImages(classes, image_size, channels, noise, seed)
        (self.images,), self.labels = source.global_micro_batch(0, samples, split_seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]
