"""A user project whose data is read the slow and the streaming way: a map-style Dataset that sleeps per item and
adds random noise (an augmentation), and an IterableDataset of the same items that shuffles itself each epoch."""

from __future__ import annotations

from pathlib import Path

DATA = '''
import time

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset


def item(i):
    g = torch.Generator().manual_seed(i)
    user, item = torch.randint(0, 50, (), generator=g), torch.randint(0, 40, (), generator=g)
    dense = torch.randn(4, generator=g)
    label = ((user % 3 == 0) ^ (dense[0] > 0.5)).float()
    return user, item, dense, label


class Slow(Dataset):
    """Reads an item in ``delay`` seconds and jitters its dense features (a random augmentation)."""

    def __init__(self, n: int, delay: float = 0.0):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        user, item_, dense, label = item(i)
        return user, item_, dense + 0.1 * torch.randn(4), label


class Stream(IterableDataset):
    """The same items, shuffled anew each time it is read (with torch's global generator)."""

    opened = 0
    """Times any Stream was read (the launcher's preflight counts here: it reads each dataset once)."""

    def __init__(self, n: int):
        self.n = n
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        Stream.opened += 1
        for i in torch.randperm(self.n).tolist():
            user, item_, dense, label = item(i)
            yield user, item_, dense + 0.1 * torch.randn(4), label


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_emb = nn.Embedding(50, 8)
        self.item_emb = nn.Embedding(40, 8)
        self.head = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user, item, dense):
        x = torch.cat([self.user_emb(user), self.item_emb(item), dense], dim=1)
        return self.head(x).squeeze(-1)
'''

RECIPE = '''# @package _global_
recipe: {name: %s}
model: {_target_: loaders.data.Model}
data: {_target_: loaders.data.%s, n: %d}
eval_data: {_target_: loaders.data.%s, n: 96}
loss: {_target_: torch.nn.BCEWithLogitsLoss}
optimizer: {name: adam, lr: 0.01}
batch: {global_size: 16}
'''


def write_project(folder: Path) -> Path:
    (folder / "loaders").mkdir(parents=True, exist_ok=True)
    (folder / "loaders" / "__init__.py").write_text("")
    (folder / "loaders" / "data.py").write_text(DATA)
    (folder / "conf" / "recipe").mkdir(parents=True, exist_ok=True)
    (folder / "conf" / "recipe" / "slow.yaml").write_text(RECIPE % ("slow", "Slow", 256, "Slow"))
    (folder / "conf" / "recipe" / "stream.yaml").write_text(RECIPE % ("stream", "Stream", 200, "Stream"))
    return folder
