"""The data source around a user's Dataset(s) (``UserData``): a map-style ``torch.utils.data.Dataset`` is batched by
``DataLoader`` (its collate: ``default_collate``, or ``loader.collate_fn``) and sharded by dp rank with
``DistributedSampler`` (seeded, reshuffled every epoch, the last partial batch dropped), as PyTorch users expect; an
``IterableDataset`` is ``StreamData``, read by launcher/usercode/stream.py. Either is read by the plan's DataLoader settings (workers,
pinned memory, read-ahead: ``loader:``; launcher/plan/loader.py), each sample seeded by (seed, epoch, its index)
(launcher/usercode/loading.py). A batch is ``(input_1, ..., input_k, label)``, a dict of keyword inputs and a label,
or an object with them as attributes (``launcher.usercode.items``).

Global micro-batch k is the same samples however it is split over ranks: rank r of dp takes every dp-th index of
the epoch's permutation, so ranks 0..dp-1's k-th micro-batches together are positions [k·m·dp, (k+1)·m·dp) of it.
Resuming at global micro-batch k reads on from there: the same samples, read the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hydra.utils import instantiate
from torch.utils.data import DataLoader, DistributedSampler

from launcher.contract import Batch
from launcher.usercode.items import split_item
from launcher.usercode.loading import Batches, SeededItems, loader
from launcher.usercode.stream import Shares, held_out, read
from launcher.usercode.targets import build_collate


def is_stream(dataset: Any) -> bool:
    """Whether ``dataset`` is read by iterating it (a torch IterableDataset, or any iterable without ``[i]``)."""
    from torch.utils.data import IterableDataset

    return isinstance(dataset, IterableDataset) or (hasattr(dataset, "__iter__") and
                                                    not hasattr(dataset, "__getitem__"))


def UserData(train: dict[str, Any], eval: dict[str, Any] | None = None,  # noqa: A002 N802 (YAML key; a factory)
             data_inputs: list[str] | None = None, data_label: str = "", collate_fn: Any = None,
             loader: dict[str, Any] | None = None, val: dict[str, Any] | None = None) -> Any:
    """What every rank builds from the plan's data spec: MapData, or StreamData for an iterable train Dataset; with
    ``val`` (val_data) it also gives the validation split (``val_batches``)."""
    built = instantiate(train, _convert_="all")
    held = instantiate(eval, _convert_="all") if eval else None
    keys = (tuple(data_inputs or ()), data_label)
    source = (StreamData if is_stream(built) else MapData)(built, held, keys, build_collate(collate_fn),
                                                           dict(loader or {}))
    source.val = instantiate(val, _convert_="all") if val else None
    return source


def val_batches(source: Any, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
    """The validation split (val_data, map-style) as eval_batches gives eval_data: every dp-th item, padded to a
    multiple of dp, read by its own DataLoader."""
    yield from MapData(None, source.val, source._keys, source._collate, source._settings).eval_batches(
        dp_rank, dp_size, micro_size, count)


class MapData:
    def __init__(self, train: Any, eval: Any = None, keys: tuple[tuple[str, ...], str] = ((), ""),  # noqa: A002
                 collate: Any = None, settings: dict[str, Any] | None = None) -> None:
        self.train, self.eval, self.val = train, eval, None
        self._keys = keys
        """(data_inputs, data_label) for dict items."""
        self._collate = collate
        """loader.collate_fn, built (None: default_collate)."""
        self._settings = dict(settings or {})
        """DataLoader keyword arguments (launcher/plan/loader.py LoaderPlan.kwargs)."""
        self._loaders: dict[str, tuple[DataLoader, Batches]] = {}

    def _batches(self, split: str, dataset: Any, seed: int, keys: list[tuple[int, int]], micro_size: int,
                 drop_last: bool) -> Iterator[Batch]:
        """The micro-batches of ``keys`` ((epoch, index) each), read by this split's DataLoader (made once, so
        persistent workers last the run)."""
        if split not in self._loaders:
            order = Batches()
            self._loaders[split] = (loader(SeededItems(dataset, seed), seed, self._settings, batch_sampler=order,
                                           collate_fn=self._collate), order)
        data, order = self._loaders[split]
        end = len(keys) - len(keys) % micro_size if drop_last else len(keys)
        order.batches = [keys[i:i + micro_size] for i in range(0, end, micro_size)]
        for items in data:
            yield split_item(items, *self._keys)

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[Batch]:
        sampler = DistributedSampler(self.train, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=seed,
                                     drop_last=True)
        per_epoch = len(sampler) // micro_size
        epoch, skip = divmod(start, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            keys = [(epoch, i) for i in list(sampler)[skip * micro_size: per_epoch * micro_size]]
            yield from self._batches("train", self.train, seed, keys, micro_size, True)
            epoch, skip = epoch + 1, 0

    def val_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        return val_batches(self, dp_rank, dp_size, micro_size, count)

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        """All of eval_data, every dp-th item from dp_rank on, as DistributedSampler(shuffle=False) deals it: padded
        with the first items to a multiple of dp, so every rank runs the same number of equal forwards (DDP and
        ZeRO-3 forwards are collective). ``count`` is for endless data; unused here."""
        if self.eval is None:
            return
        if is_stream(self.eval):
            yield from held_out(self.eval, self._collate, self._keys, self._settings, (dp_rank, dp_size), micro_size,
                                count)
            return
        n = len(self.eval)
        total = -(-n // dp_size) * dp_size
        order = [i % n for i in range(total)]
        keys = [(0, i) for i in order[dp_rank:total:dp_size]]
        yield from self._batches("eval", self.eval, 0, keys, micro_size, False)

    def held_out_items(self, split: str, dp_rank: int, dp_size: int) -> int | None:
        """How many of the items eval_batches (split test) or val_batches (val) deal rank ``dp_rank`` are the held-out
        set's own, in the order dealt: the rest repeat its first items as padding, to be run but not scored. None for
        a stream (nothing is padded)."""
        held = self.val if split == "val" else self.eval
        return None if held is None or is_stream(held) else len(range(dp_rank, len(held), dp_size))


class StreamData:
    """The data source of an iterable train Dataset; its held-out data may be map-style or iterable."""

    def __init__(self, train: Any, eval: Any = None, keys: tuple[tuple[str, ...], str] = ((), ""),  # noqa: A002
                 collate: Any = None, settings: dict[str, Any] | None = None) -> None:
        self.train, self.eval, self.val, self._keys, self._collate = train, eval, None, keys, collate
        self._settings = dict(settings or {})

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[Batch]:
        yield from read(Shares(self.train, self._collate, seed, (dp_rank, dp_size), micro_size, start, True),
                        self._keys, self._settings, seed)

    def val_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        return val_batches(self, dp_rank, dp_size, micro_size, count)

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        """As MapData's: its held-out data may be map-style or iterable."""
        yield from MapData(None, self.eval, self._keys, self._collate, self._settings).eval_batches(
            dp_rank, dp_size, micro_size, count)

    held_out_items = MapData.held_out_items  # its held-out data may be map-style (padded) or a stream
