"""A user's ``IterableDataset`` (a stream: WebDataset, HuggingFace datasets' streaming mode, a Parquet reader of
your own) as the ranks' data source.

The stream is cut into global micro-batches of micro_size × dp items in the order it yields them; rank r takes
items [r·m, (r+1)·m) of each, and DataLoader worker w of W collates global micro-batches k ≡ w (mod W) from where the
run starts: every sample is used once per epoch across the job, and every rank runs the same number of steps
(collectives must match). An epoch ends where the stream does; its last, partial global micro-batch is dropped. A
Dataset with ``set_epoch(epoch)`` (HuggingFace's, WebDataset's convention) is told each epoch, and each epoch's
iteration runs with its random state seeded by (seed, epoch), kept apart from the training thread's: so every rank
and every worker reads the same stream, which is what makes taking one share of it right.

Every rank and worker reads the whole stream and keeps its own share (torchdata's sharding filter): the reading
is repeated dp × W times, the collating, moving and training is not. A resumed run reads the stream again from the
epoch's start, skipping (not collating) the micro-batches already trained on: the same samples as the uninterrupted
run, for a stream that yields the same items each time it is read with the same seed.

Held-out data is read once to its end, or ``count`` global micro-batches of an endless one; the last partial one is
padded with its first items to a multiple of dp and dealt evenly, so every rank runs the same number of forwards."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, default_collate, get_worker_info

from launcher.contract import Batch
from launcher.usercode.items import split_item
from launcher.usercode.loading import item_seed, loader, own_random_state, rng_state, same, seed_all, set_rng_state


class EmptyStream(ValueError):
    """An epoch of the stream held fewer items than one global micro-batch."""


class RandomApart:
    """A random state of its own, seeded once: ``with apart:`` runs the block in it and puts the caller's back."""

    def __init__(self, seed: int) -> None:
        with own_random_state():
            seed_all(seed)
            self.state = rng_state()
        self.outer: Any = None

    def __enter__(self) -> None:
        self.outer = rng_state()
        set_rng_state(self.state)

    def __exit__(self, *exc: Any) -> None:
        self.state = rng_state()
        set_rng_state(self.outer)


def global_batches(dataset: Any, seed: int, size: int, endless: bool) -> Iterator[tuple[int, int, list[Any]]]:
    """(epoch, k, items) of each global micro-batch of ``size`` items, k counting from 0 across epochs; the stream
    is read in a random state of its own, seeded by (seed, epoch) at each epoch's start. A held-out stream (not
    ``endless``) ends after one pass, its last partial micro-batch included."""
    k, epoch = 0, 0
    while True:
        apart, first = RandomApart(item_seed(seed, epoch, -1)), k
        with apart:
            if callable(getattr(dataset, "set_epoch", None)):
                dataset.set_epoch(epoch)
            it = iter(dataset)
        while True:
            with apart:
                items = list(itertools.islice(it, size))
            if len(items) == size or (items and not endless):
                yield epoch, k, items
                k += 1
            if len(items) < size:
                break
        if not endless:
            return
        if k == first:
            raise EmptyStream(f"epoch {epoch} of the stream held fewer items than one global micro-batch ({size}); "
                              f"give more data or lower batch.global_size")
        epoch += 1


def dealt(items: list[Any], dp: int) -> list[Any]:
    """``items`` padded with its first ones to a multiple of ``dp`` (a held-out stream's last micro-batch)."""
    return [items[i % len(items)] for i in range(-(-len(items) // dp) * dp)]


class Shares(IterableDataset):
    """What one DataLoader worker (or the rank itself, without workers) yields: rank ``dp_rank``'s collated share of
    global micro-batches start + w, start + w + W, ... (worker w of W); at most ``count`` of a held-out stream."""

    def __init__(self, dataset: Any, collate: Any, seed: int, dp: tuple[int, int], micro_size: int, start: int,
                 endless: bool, count: int = 0) -> None:
        self.dataset, self.collate, self.seed = dataset, collate or default_collate, seed
        self.dp, self.micro_size, self.start, self.endless, self.count = dp, micro_size, start, endless, count

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, size = self.dp
        for epoch, k, items in global_batches(self.dataset, self.seed, self.micro_size * size, self.endless):
            if self.count and k >= self.count:
                return
            if k < self.start or (k - self.start) % workers != worker:
                continue
            items = dealt(items, size)
            share = len(items) // size
            with own_random_state():
                seed_all(item_seed(self.seed, epoch, k))
                batch = self.collate(items[rank * share:(rank + 1) * share])
            yield batch


def read(shares: Shares, keys: tuple[tuple[str, ...], str], settings: dict[str, Any], seed: int) -> Iterator[Batch]:
    """The micro-batches ``shares`` yields, through a DataLoader of the plan's settings (one per pass: no persistent
    workers), split into inputs and a label."""
    for batch in loader(shares, seed, {**settings, "persistent_workers": False}, batch_size=None, collate_fn=same):
        yield split_item(batch, *keys)


def held_out(dataset: Any, collate: Any, keys: tuple[tuple[str, ...], str], settings: dict[str, Any],
             dp: tuple[int, int], micro_size: int, count: int) -> Iterator[Batch]:
    """A held-out stream read once (at most ``count`` global micro-batches, 0 = all), dealt evenly over the ranks."""
    yield from read(Shares(dataset, collate, 0, dp, micro_size, 0, False, count), keys, settings, 0)
