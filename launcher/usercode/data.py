"""The data source around a user's map-style ``torch.utils.data.Dataset``: ranks batch it with ``DataLoader`` (its
collate: ``default_collate``, or ``loader.collate_fn``) and shard it by dp rank with ``DistributedSampler``
(seeded, reshuffled every epoch, the last partial batch dropped), as PyTorch users expect. A batch is ``(input_1, ...,
input_k, label)``, a dict of keyword inputs and a label, or an object with them as attributes
(``launcher.usercode.items``).

Global micro-batch k is the same samples however it is split over ranks: rank r of dp takes every dp-th index of
the epoch's permutation, so ranks 0..dp-1's k-th micro-batches together are positions [k·m·dp, (k+1)·m·dp) of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hydra.utils import instantiate
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from launcher.contract import Batch
from launcher.usercode.items import split_item
from launcher.usercode.targets import build_collate


class MapData:
    _keys: tuple[tuple[str, ...], str] = ((), "")
    """(data_inputs, data_label) for dict items."""
    _collate: Any = None
    """loader.collate_fn, built (None: default_collate)."""

    def __init__(self, train: dict[str, Any], eval: dict[str, Any] | None = None,  # noqa: A002 (YAML key)
                 data_inputs: list[str] | None = None, data_label: str = "", collate_fn: Any = None) -> None:
        self.train = instantiate(train, _convert_="all")
        self.eval = instantiate(eval, _convert_="all") if eval else None
        self._keys = (tuple(data_inputs or ()), data_label)
        self._collate = build_collate(collate_fn)

    def _loader(self, dataset: Any, order: list[int], micro_size: int, drop_last: bool) -> DataLoader:
        return DataLoader(dataset, batch_sampler=BatchSampler(order, micro_size, drop_last=drop_last),
                          collate_fn=self._collate)

    def _split(self, items: Any) -> Batch:
        return split_item(items, *self._keys)

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[Batch]:
        sampler = DistributedSampler(self.train, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=seed,
                                     drop_last=True)
        per_epoch = len(sampler) // micro_size
        epoch, skip = divmod(start, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            order = list(sampler)[skip * micro_size : per_epoch * micro_size]
            for items in self._loader(self.train, order, micro_size, True):
                yield self._split(items)
            epoch, skip = epoch + 1, 0

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        """All of eval_data, every dp-th item from dp_rank on, as DistributedSampler(shuffle=False) deals it: padded
        with the first items to a multiple of dp, so every rank runs the same number of equal forwards (DDP and
        ZeRO-3 forwards are collective). ``count`` is for endless data; unused here."""
        if self.eval is None:
            return
        n = len(self.eval)
        total = -(-n // dp_size) * dp_size
        order = [i % n for i in range(total)]
        mine = order[dp_rank:total:dp_size]
        for items in self._loader(self.eval, mine, micro_size, False):
            yield self._split(items)
