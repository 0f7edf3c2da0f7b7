"""The network of MindSpore's Host&Device sample: Flatten → Dense 784×512 → ReLU → Dense 512×512 → ReLU → Dense
512×10 (each Dense a MatMul and an Add). ``placement.modules.<name>: host`` puts a Dense on the host CPU."""

from __future__ import annotations

import torch
from torch import nn


class HostDeviceNet(nn.Module):
    def __init__(self, in_features: int = 784, hidden: int = 512, classes: int = 10) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense1 = nn.Linear(in_features, hidden)
        self.relu1 = nn.ReLU()
        self.dense2 = nn.Linear(hidden, hidden)
        self.relu2 = nn.ReLU()
        self.dense3 = nn.Linear(hidden, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (batch, classes) of images (batch, 28, 28) or (batch, 784)."""
        x = self.relu1(self.dense1(self.flatten(images)))
        return self.dense3(self.relu2(self.dense2(x)))
