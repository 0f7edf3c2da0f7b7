"""What a user's own data and model bring, checked before anything starts: a collate function (loader.collate_fn) and
the batches it makes (tuples, dicts, dataclass batches, nested structures); raw feature ids a table cannot index,
and the hash that maps them (tables.<name>.hash); a model whose forward breaks only with its tables outside the
parts; a package that runs code at import under a nested _target_. Each mistake is one message naming the key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from launcher.errors import ConfigError
from tests.conftest import plan_of

CODE = '''
import dataclasses

import torch
from torch import nn
from torch.utils.data import Dataset


class Ids(Dataset):
    """Items (ids of 1-3 entries, dense (4,), label): ragged, so default_collate cannot batch them."""

    def __init__(self, n: int = 64, rows: int = 100, raw: bool = False, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(1, 4, (n,), generator=g)
        self.ids = [torch.randint(0, rows, (int(k),), generator=g) for k in self.lengths]
        if raw:
            self.ids = [i * -7046029254386353131 + 17 for i in self.ids]
        self.dense = torch.randn(n, 4, generator=g)
        self.label = torch.bernoulli(torch.full((n,), 0.5), generator=g)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return self.ids[i], self.dense[i], self.label[i]


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor
    offsets: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor


def bags(items):
    """(ids, offsets, dense, label): a bag per item."""
    ids = torch.cat([it[0] for it in items])
    offsets = torch.tensor([0] + [len(it[0]) for it in items[:-1]]).cumsum(0)
    return ids, offsets, torch.stack([it[1] for it in items]), torch.stack([it[2] for it in items])


def as_batch(items):
    return Batch(*bags(items))


def nested(items, scale: float = 1.0):
    """({"bag": (ids, offsets)}, {"dense": ...}, label): structures of tensors as inputs."""
    ids, offsets, dense, label = bags(items)
    return {"bag": (ids, offsets)}, {"dense": dense * scale}, label


def one(items):
    return (torch.stack([it[2] for it in items]),)


def broken(items):
    raise RuntimeError("no batch for you")


class Bag(nn.Module):
    def __init__(self, rows: int = 100, dim: int = 4):
        super().__init__()
        self.emb = nn.EmbeddingBag(rows, dim, mode="sum")
        self.head = nn.Linear(dim + 4, 1)

    def forward(self, ids, offsets, dense):
        return self.head(torch.cat([self.emb(input=ids, offsets=offsets), dense], 1)).squeeze(-1)


class NestedBag(Bag):
    def forward(self, bag, extra):
        return super().forward(*bag["bag"] if "bag" in bag else bag, extra["dense"])


class ReadsWeight(Bag):
    """Uses its table's weight itself: it cannot run with the table outside the parts."""

    def forward(self, ids, offsets, dense):
        return self.head(torch.cat([self.emb(ids, offsets) * self.emb.weight.norm(), dense], 1)).squeeze(-1)


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids, offsets, dense):
        return self.inner(ids, offsets, dense)
'''

SIDE_EFFECT = '''
"""Like tensordict (which TorchRec imports): code that runs at import and needs real tensors."""
import torch

CHECK = torch.ones(1).item()

from batches_code.code import Bag as Inner  # noqa: E402
'''

RECIPE = """
# @package _global_
recipe: {name: bags}
model: {_target_: batches_code.code.Bag}
data: {_target_: batches_code.code.Ids}
loader: {collate_fn: batches_code.code.bags}
loss: {_target_: torch.nn.BCEWithLogitsLoss}
trainer: {steps: 2}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("batches")
    (root / "batches_code").mkdir()
    (root / "batches_code" / "__init__.py").write_text("")
    (root / "batches_code" / "code.py").write_text(textwrap.dedent(CODE))
    (root / "batches_code" / "side_effect.py").write_text(SIDE_EFFECT)
    (root / "conf" / "recipe").mkdir(parents=True)
    (root / "conf" / "recipe" / "bags.yaml").write_text(RECIPE)
    return root


def plan(project: Path, *overrides: str, host):
    import os

    cwd = os.getcwd()
    os.chdir(project)
    try:
        return plan_of(["recipe=bags", *overrides], host, config_dir=str(project / "conf"))
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("overrides", [
    [],
    ["loader.collate_fn={_target_: batches_code.code.bags}"],
    ["loader.collate_fn=batches_code.code.as_batch"],  # a dataclass batch: its fields are keyword inputs
    ["loader.collate_fn={_target_: batches_code.code.nested, scale: 2.0}", "model._target_=batches_code.code.NestedBag"],
    ["placement.host_device_mix=1"],
    ["placement.ps=true", "loader.collate_fn=batches_code.code.as_batch"],
])
def test_batches_a_collate_makes_plan(project, cpu_host, overrides):
    p = plan(project, *overrides, host=cpu_host)
    assert p.data["collate_fn"] is not None
    from hydra.utils import instantiate

    data = instantiate(p.data)  # what every rank builds: the Dataset in MapData with the collate
    inputs, label = next(data.train_batches(0, 2, 4, seed=0))
    assert label.shape == (4,)
    leaves = torch.utils._pytree.tree_leaves(inputs)
    assert all(torch.is_tensor(t) for t in leaves) and len(leaves) >= 3


@pytest.mark.parametrize("overrides, message", [
    (["loader.collate_fn=null"], r"data \(.*bags.yaml\): items 0 and 1 do not batch together: RuntimeError: stack "
                                 r"expects each tensor to be equal size.* \(or a loader.collate_fn that batches them\)"),
    (["loader.collate_fn=batches_code.code.bagz"], r"loader.collate_fn=batches_code.code.bagz \(.*\): "
                                                   r"AttributeError: module 'batches_code.code' has no attribute"),
    (["loader.collate_fn=batches_code.code.broken"], r"item 0 of batches_code.code.Ids does not batch with "
                                                     r"loader.collate_fn: RuntimeError: no batch for you"),
    (["loader.collate_fn=batches_code.code.one"], r"batches into a 1-element tuple: a batch is \(input_1, ..., "
                                                  r"input_k, label\)"),
    (["loader.collate_fn=batches_code.code.as_batch", "data_label=click"],
     r"item 0 of batches_code.code.Ids has no label key click. Set data_label \(and data_inputs\) to its keys: ids, "
     r"offsets, dense, labels"),
    (["data_label=label"], r"batches into a 4-element tuple \(positional inputs, the label last\), so data_label would "
                           r"do nothing"),
    (["+data.raw=true"], r"data \(.*\): table emb has 100 rows \(ids 0 .. 99\); the batch looked up ids from .* Raw "
                         r"feature ids\? Set tables.emb.hash=100"),
    (["+data.raw=true", "tables.emb.hash=1000"], r"tables.emb.hash=1,000: the table has 100 rows"),
    (["tables.emb.hash=50", "tables.emb.optimizer=dense"], r"tables.emb.hash=50 with tables.emb.optimizer=dense"),
    (["tables.emb.hash_fn=murmur", "tables.emb.hash=50"], r"tables.emb.hash_fn=murmur is not one of mix, mod"),
    (["tables.emb.hash_fn=mod"], r"tables.emb.hash_fn=mod has no effect without tables.emb.hash"),
    (["model._target_=batches_code.code.ReadsWeight", "placement.host_device_mix=1"],
     r"with its tables emb outside the parallel parts .* its forward fails on a batch of 2 dataset items, which it "
     r"takes as written: AttributeError: .*weight"),
])
def test_each_mistake_is_named(project, cpu_host, overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan(project, *overrides, host=cpu_host)


def test_raw_ids_plan_with_a_hash_and_a_model_that_reads_its_weight_as_written(project, cpu_host):
    p = plan(project, "+data.raw=true", "tables.emb.hash=100", "tables.emb.hash_fn=mod", host=cpu_host)
    (table,) = p.placement.tables
    assert (table.hash_buckets, table.hash_fn, table.location) == (100, "mod", "device")
    assert plan(project, "model._target_=batches_code.code.ReadsWeight", host=cpu_host).placement.tables[0].location \
        == "engine"  # trained inside the parts as written: the weight is there


def test_a_nested_target_is_imported_before_the_model_is_built_on_meta(project, cpu_host):
    p = plan(project, "model._target_=batches_code.code.Wrapper", "+model.inner._target_=batches_code.side_effect.Inner",
             host=cpu_host)
    assert p.model["inner"]["_target_"] == "batches_code.side_effect.Inner"


def test_loader_keys_refused_where_they_do_nothing(project, cpu_host, tmp_path):
    with pytest.raises(ConfigError, match=r"loader.collate_fn: recipe wide_deep batches its own data"):
        plan_of(["recipe=wide_deep", "loader.collate_fn=batches_code.code.bags"], cpu_host)
    from launcher.config import compose_config
    from launcher.backends import BACKENDS
    from launcher.parallel import RULES
    from launcher.plan.script import plan_script

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(ConfigError, match=r"loader.collate_fn with script=: your script builds its own DataLoader"):
        plan_script(compose_config([f"script={script}", "loader.collate_fn=x.y"]), cpu_host, backends=tuple(BACKENDS.values()), parts=RULES)
