"""What reading a user's Dataset shares between map-style and iterable data: random state that belongs to the data,
not to the training thread, and the DataLoader around it.

A sample's randomness (an augmentation's crop, a tokenizer's masking) is seeded by (trainer.seed, epoch, the sample's
index) where it is read, in torch's, Python's and numpy's generators, and the generators the training thread uses
(dropout) are put back afterwards: so a run reads the same samples the same way with 0 or N workers, on any number of
ranks, and after a resume (torch's own default seeds each worker from a draw of the training thread's generator, so
the samples' randomness depends on the worker count and on when the loader was created). The DataLoader itself gets a
generator of its own for the same reason: creating an iterator draws from it."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

MASK = (1 << 64) - 1


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for sample ``index`` of ``epoch`` (splitmix64's mixer over the three)."""
    z = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB + 1) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return (z ^ (z >> 31)) >> 1


def _numpy() -> Any:
    return sys.modules.get("numpy")  # seeded only where the user's code (or torch) imported it


def rng_state() -> tuple[Any, Any, Any]:
    np = _numpy()
    return torch.random.default_generator.get_state(), random.getstate(), np.random.get_state() if np else None


def set_rng_state(state: tuple[Any, Any, Any]) -> None:
    torch.random.default_generator.set_state(state[0])
    random.setstate(state[1])
    if state[2] is not None and (np := _numpy()) is not None:
        np.random.set_state(state[2])


def seed_all(seed: int) -> None:
    """torch's CPU generator, Python's and numpy's seeded with ``seed`` (CUDA's are the training thread's)."""
    torch.random.default_generator.manual_seed(seed)
    random.seed(seed)
    if (np := _numpy()) is not None:
        np.random.seed(seed % (1 << 32))


@contextmanager
def own_random_state() -> Iterator[None]:
    """Whatever runs inside leaves the training thread's random state as it found it."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


class SeededItems(Dataset):
    """A map-style Dataset read by keys (epoch, index): item ``index`` read with its random state seeded by
    (seed, epoch, index) and the caller's put back. A Dataset with a batched ``__getitems__`` (HuggingFace's) is
    read through it, seeded by the micro-batch's first key."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        with own_random_state():
            batched = getattr(self.dataset, "__getitems__", None)
            if batched is not None and len(keys) > 1:
                seed_all(item_seed(self.seed, *keys[0]))
                return list(batched([i for _, i in keys]))
            out = []
            for epoch, index in keys:
                seed_all(item_seed(self.seed, epoch, index))
                out.append(self.dataset[index])
            return out


class Batches:
    """A DataLoader's batch_sampler whose batches are set before each pass (a persistent DataLoader's workers outlive
    one epoch's order): lists of (epoch, index) keys."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def same(batch: Any) -> Any:
    """The collate of a DataLoader whose dataset yields whole batches (a module-level function: workers pickle it)."""
    return batch


def loader(dataset: Any, seed: int, settings: dict[str, Any], **kwargs: Any) -> DataLoader:
    """torch's DataLoader over ``dataset`` with the plan's ``settings`` (launcher/plan/loader.py LoaderPlan.kwargs)
    and a generator of its own."""
    return DataLoader(dataset, generator=torch.Generator().manual_seed(seed), **settings, **kwargs)
