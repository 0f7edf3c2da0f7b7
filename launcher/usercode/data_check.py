"""Preflight of a user recipe's data: its Datasets build, have a length, and their items batch with the run's collate
(``default_collate``, or ``loader.collate_fn``) into a batch that splits into inputs and a label."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate

from launcher.errors import first_words
from launcher.usercode.items import split_item

Keys = tuple[tuple[str, ...], str]
"""(data_inputs, data_label)."""


def collate_of(collate: Any):
    """The collate function the ranks batch with: ``collate`` (loader.collate_fn, built) or default_collate."""
    from torch.utils.data import default_collate

    return collate or default_collate


def item_problem(item: Any, keys: Keys, collate: Any = None) -> str:
    """Why ``item`` is not one the ranks can batch and split ('' when it is): with default_collate a tuple/list of at
    least an input and a label, or a dict with a label key; with loader.collate_fn whatever it makes of one item must
    split (a tuple, a dict or a batch object)."""
    if collate is None and (not isinstance(item, (tuple, list, Mapping))
                            or (not isinstance(item, Mapping) and len(item) < 2)):
        got = type(item).__name__ if not isinstance(item, (tuple, list)) else f"a {len(item)}-element {type(item).__name__}"
        return (f"is {got}; an item is (input_1, ..., input_k, label) or a dict of inputs and a label "
                f"({{'input_ids': ..., 'labels': ...}}), of tensors, numbers or numpy arrays; or give loader.collate_fn "
                f"(a function that batches a list of items)")
    try:
        batch = collate_of(collate)([item])
    except Exception as e:  # noqa: BLE001 (the user's collate may raise anything)
        if collate is not None:
            return f"does not batch with loader.collate_fn: {first_words(e)}"
        return (f"does not batch with DataLoader's default_collate: {first_words(e)}. Give loader.collate_fn (a "
                f"function that batches a list of items, e.g. into a KeyedJaggedTensor)")
    if isinstance(batch, (tuple, list)) and (keys[0] or keys[1]):
        given = " and ".join(k for k, v in (("data_inputs", keys[0]), ("data_label", keys[1])) if v)
        return (f"batches into a {len(batch)}-element {type(batch).__name__} (positional inputs, the label last), so "
                f"{given} would do nothing: they name the keys of dict batches or the attributes of batch objects. "
                f"Remove {given}")
    if isinstance(batch, (tuple, list)) and len(batch) < 2:
        return (f"batches into a {len(batch)}-element {type(batch).__name__}: a batch is (input_1, ..., input_k, "
                f"label), a dict of inputs and a label, or an object with them as attributes")
    try:
        split_item(batch, *keys)
    except KeyError as e:
        names = _names(batch) or (list(item) if isinstance(item, Mapping) else [])
        missing = [k for k in keys[0] if names and k not in names]
        what = f"has no key {', '.join(missing)} (data_inputs)" if missing else f"has {e.args[0]}"
        return f"{what}. Set data_label (and data_inputs) to its keys: {', '.join(map(str, names)) or '-'}"
    except (TypeError, IndexError) as e:
        return f"cannot be split into inputs and a label: {first_words(e)}"
    return ""


def _names(batch: Any) -> list[str]:
    """The keys of a dict batch, or the fields of a dataclass batch ([] for a tuple or another object)."""
    if isinstance(batch, Mapping):
        return list(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [f.name for f in dataclasses.fields(batch)]
    return []


@dataclasses.dataclass(frozen=True)
class Sample:
    """The first items of a dataset, read once in the launcher (one pass over a stream), and how long they took."""

    items: list[Any]
    seconds: float
    """Median wall seconds to read one item, after the first (which may warm caches); 0.0 with fewer than 2 items."""
    cpu_share: float
    """The share of that reading spent on a CPU (1.0 = all of it; low for reads that wait on disk or network)."""
    ended: int | None = None
    """A stream's length when it ended within what was read or counted (None: a map-style dataset, or a stream
    that went on)."""


def dataset_facts(key: str, spec: Mapping[str, Any], source: str, keys: Keys = ((), ""), collate: Any = None,
                  count: int = 1, count_to: int = 0) -> tuple[Any, Sample | None, list[str]]:
    """(the built dataset, its first ``count`` items read once, a stream counted on to ``count_to`` items, problems):
    it builds, is map-style (len() and [i]) or iterable, and its first item batches and splits (item_problem)."""
    from launcher.usercode.data import is_stream

    try:
        ds = instantiate(spec, _convert_="all")
    except Exception as e:  # noqa: BLE001
        return None, None, [f"{key} ({source}): building {spec['_target_']} failed: {first_words(e.__cause__ or e)}."]
    try:
        sample = read_sample(ds, count, count_to)
    except Exception as e:  # noqa: BLE001
        kind = "reading the first items of the IterableDataset" if is_stream(ds) else "len() and [i]"
        return None, None, [f"{key} ({source}): {spec['_target_']} is not a Dataset the ranks can read ({kind}: "
                            f"{first_words(e)}). Give a torch.utils.data.Dataset with __len__ and __getitem__, or an "
                            f"IterableDataset whose items all read."]
    if not sample.items:
        return None, None, [f"{key} ({source}): {spec['_target_']} has no items. Give a non-empty dataset."]
    why = item_problem(sample.items[0], keys, collate)
    if why:
        return None, None, [f"{key} ({source}): item 0 of {spec['_target_']} {why}."]
    return ds, sample, []


COUNT_SECONDS = 10.0
"""How long the launcher goes on counting a stream's items (read_sample's ``count_to``) before it lets the ranks find
out whether an epoch holds a global micro-batch."""
READ_SECONDS = 10.0
"""How long the launcher reads a dataset's first items (read_sample's ``count``) before it makes do with those it has
(two at least: the checks batch two): a dataset that reads from a slow store (1 s an item) would keep the launcher
silent for minutes before anything starts, a dry run too."""


def read_sample(dataset: Any, count: int, count_to: int = 0) -> Sample:
    """The dataset's first ``count`` items (fewer when it has fewer, or when reading them took READ_SECONDS), each
    read timed: by index, or by iterating a stream once (in a random state of its own, as the ranks read it). A
    stream is counted on, its items not kept, to ``count_to`` items or COUNT_SECONDS: ``ended`` is its length when it
    ended by then (None also when the reading stopped at READ_SECONDS)."""
    import itertools
    import statistics
    import time

    from launcher.usercode.data import is_stream
    from launcher.usercode.loading import own_random_state

    with own_random_state():
        source = iter(dataset) if is_stream(dataset) else (dataset[i] for i in range(min(count, len(dataset))))
        items: list[Any] = []
        walls: list[float] = []
        start = last = begun = time.perf_counter()
        cpu, cut = 0.0, False
        for item in itertools.islice(source, count):
            now = time.perf_counter()
            if items:
                walls.append(now - last)
            else:  # the first read may warm caches: timing starts after it
                start, cpu = now, time.process_time()
            items.append(item)
            last = now
            if len(items) >= 2 and now - begun > READ_SECONDS and len(items) < count:
                cut = True  # enough to check; the ranks read the rest
                break
        cpu = time.process_time() - cpu
        ended = _count_on(source, len(items), count, count_to) if is_stream(dataset) and not cut else None
    if not walls:
        return Sample(items, 0.0, 1.0, ended)
    wall = last - start
    return Sample(items, statistics.median(walls), min(1.0, cpu / wall) if wall > 0 else 1.0, ended)


def _count_on(source: Any, read: int, count: int, count_to: int) -> int | None:
    """A stream's length, counting on past the ``read`` items kept to ``count_to`` (None when it goes on)."""
    import time

    if read < count:
        return read
    deadline, end = time.monotonic() + COUNT_SECONDS, object()
    for n in range(read, max(read, count_to)):
        if next(source, end) is end:
            return n
        if time.monotonic() > deadline:
            return None
    return None


def two_items(items: list[Any], keys: Keys, collate: Any = None) -> tuple[Any, Any]:
    """The first two items batched as the ranks' DataLoader does: (inputs, label)."""
    return split_item(collate_of(collate)(items[:2]), *keys)


def one_item(items: list[Any], keys: Keys, collate: Any = None) -> tuple[Any, Any]:
    """The first item batched alone, as a micro-batch of one item: (inputs, label)."""
    return split_item(collate_of(collate)(items[:1]), *keys)


def item_labels(items: list[Any], keys: Keys, collate: Any = None) -> list:
    """The labels of ``items``, each batched alone as the ranks' DataLoader batches it."""
    batch = collate_of(collate)
    return [split_item(batch([item]), *keys)[1] for item in items]
