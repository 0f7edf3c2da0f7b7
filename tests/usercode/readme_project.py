"""docs/your_model.md's "Bring your own model" files (and its runtime.prepare() loop), copied verbatim into a folder:
what the tests train, so the manual's example is the one that is tested."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "your_model.md"
_FILE = re.compile(r"^`([\w./]+\.(?:py|yaml))`:\n```\w+\n(.*?)^```", re.MULTILINE | re.DOTALL)

EXTRA = {
    # What the error tests need beside the page's files (a user's mistakes), and a nested model.
    "my_ctr/extra.py": '''
import torch
from torch import nn
from torch.utils.data import Dataset

from my_ctr.data import Clicks


class DictItems(Clicks):
    def __getitem__(self, i):
        return {"user": self.user[i], "label": self.label[i]}


class ColumnLabels(Clicks):
    def __getitem__(self, i):
        return self.user[i], self.item[i], self.dense[i], self.label[i].reshape(1)


class Towers(nn.Module):
    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4):
        super().__init__()
        self.user_emb = nn.Embedding(users, dim)
        self.towers = nn.ModuleList([nn.ModuleDict({"item_emb": nn.Embedding(items, dim)})])
        self.head = nn.Linear(2 * dim + dense, 1)

    def forward(self, user, item, dense):
        x = torch.cat([self.user_emb(user), self.towers[0]["item_emb"](item), dense], dim=1)
        return self.head(x).squeeze(-1)


class Features(nn.Module):
    def __init__(self, users: int, items: int, dim: int):
        super().__init__()
        self.user_emb = nn.Embedding(users, dim)
        self.item_emb = nn.Embedding(items, dim)

    def forward(self, user, item, dense):
        return torch.cat([self.user_emb(user), self.item_emb(item), dense], dim=1)


class Unused(nn.Module):
    """The page's Net with a layer built and never called (a head kept for later): no gradient ever reaches it."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__()
        from my_ctr.model import Net

        self.net = Net(users, items, dim, dense, hidden)
        self.spare = nn.Linear(hidden, 1)

    def forward(self, user, item, dense):
        return self.net(user, item, dense)


class Frozen(Unused):
    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        self.requires_grad_(False)


class Normalized(Unused):
    """BatchNorm over the dense features: in training it needs two values per channel, so two items a micro-batch."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        del self.spare
        self.norm = nn.BatchNorm1d(dense)

    def forward(self, user, item, dense):
        return self.net(user, item, self.norm(dense))


class NoParameters(nn.Module):
    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__()

    def forward(self, user, item, dense):
        return dense.sum(1)


class Staged(nn.Module):
    """A model a pipeline can cut: its forward is its children in order, the first taking every input."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4):
        super().__init__()
        self.features = Features(users, items, dim)
        self.hidden = nn.Sequential(nn.Linear(2 * dim + dense, 16), nn.ReLU())
        self.out = nn.Sequential(nn.Linear(16, 1), nn.Flatten(0))

    def forward(self, user, item, dense):
        return self.out(self.hidden(self.features(user, item, dense)))


class Double(Unused):
    """The page's Net in float64 (its data's dense features then arrive as float32, cast by the run's precision)."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        self.double()


class SparseGrads(Unused):
    """The page's Net with its user table giving sparse gradients (nn.Embedding(sparse=True))."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        self.net.user_emb = nn.Embedding(users, dim, sparse=True)


class OnCuda(Unused):
    """The page's Net moved to the GPU in its constructor, as a script written for one GPU does."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        self.to("cuda")


class ReadsAValue(Unused):
    """The page's Net whose constructor reads a parameter's value (a scale from its first weights): plain torch builds
    it, the meta device has no values."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        self.scale = float(self.net.mlp[0].weight.abs().max().item()) + 1.0


class TwoClasses(Unused):
    """Two scores an item, for CrossEntropyLoss over the integer labels of IntClicks."""

    def __init__(self, users: int, items: int, dim: int = 8, dense: int = 4, hidden: int = 64):
        super().__init__(users, items, dim, dense, hidden)
        self.net.mlp[-1] = nn.Linear(hidden, 2)
''',
    "my_ctr/int_clicks.py": '''from my_ctr.data import Clicks


class IntClicks(Clicks):
    """The page's clicks with integer class labels (0 or 1 as int64), as CrossEntropyLoss takes them."""

    def __getitem__(self, i):
        user, item, dense, label = super().__getitem__(i)
        return user, item, dense, label.long()
''',
}


def readme_files() -> dict[str, str]:
    files = dict(_FILE.findall(PAGE.read_text()))
    assert {"my_ctr/model.py", "my_ctr/data.py", "conf/recipe/my_ctr.yaml", "train_ctr.py"} <= set(files), files
    return files


def write_project(folder: Path, extra: bool = False) -> Path:
    """The page's project in ``folder`` (plus EXTRA when asked); returns the folder."""
    for name, text in {**readme_files(), **(EXTRA if extra else {})}.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder
