"""A ResNet-50-shaped network (He et al. 2016; MindSpore's pipeline example): a stem ("head"), four stages of
bottleneck blocks (3, 4, 6, 3 by default) and a classifier ("fc"), with its widths scaled down to train on a CPU.
``named_layers`` gives head, layer1 ... layer4, fc in forward order: what recompute (and pipeline stages) name."""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (with the stride), 1x1 expand by 4, plus the shortcut (projected when the shape changes)."""

    def __init__(self, inputs: int, mid: int, stride: int) -> None:
        super().__init__()
        out = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(inputs, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out),
        )
        self.shortcut = nn.Identity() if stride == 1 and inputs == out else nn.Sequential(
            nn.Conv2d(inputs, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, classes: int, width: int, blocks: list[int], channels: int = 3) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        inputs, stages = width, []
        for i, count in enumerate(blocks):
            mid = width * 2**i
            stage = [Bottleneck(inputs if b == 0 else mid * 4, mid, 2 if i > 0 and b == 0 else 1) for b in range(count)]
            stages.append(nn.Sequential(*stage))
            inputs = mid * 4
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes))

    def named_layers(self) -> list[tuple[str, nn.Module]]:
        return [(n, getattr(self, n)) for n in ("head", "layer1", "layer2", "layer3", "layer4", "fc")]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images
        for _, layer in self.named_layers():
            x = layer(x)
        return x
