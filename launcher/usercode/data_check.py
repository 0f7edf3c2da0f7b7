"""Preflight of a user recipe's data: its Datasets build, have a length, and their items batch with the run's collate
(``default_collate``, or ``loader.collate_fn``) into a batch that splits into inputs and a label."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate

from launcher.errors import first_line
from launcher.usercode.items import split_item

Keys = tuple[tuple[str, ...], str]
"""(data_inputs, data_label)."""


def first_words(e: BaseException) -> str:
    """``Type: first line`` of an exception (errors.first_line with the exception's type in front)."""
    return f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__


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


def dataset_facts(key: str, spec: Mapping[str, Any], source: str, keys: Keys = ((), ""),
                  collate: Any = None) -> tuple[Any, list[str]]:
    """(the built dataset, problems): it builds, is map-style (len() and [i]) or iterable, and its items batch and
    split (item_problem)."""
    from launcher.usercode.data import is_stream

    try:
        ds = instantiate(spec, _convert_="all")
    except Exception as e:  # noqa: BLE001
        return None, [f"{key} ({source}): building {spec['_target_']} failed: {first_words(e.__cause__ or e)}."]
    try:
        got = first_items(ds, 1)
    except Exception as e:  # noqa: BLE001
        kind = "reading the first item of the IterableDataset" if is_stream(ds) else "len() and [0]"
        return None, [f"{key} ({source}): {spec['_target_']} is not a Dataset the ranks can read ({kind}: "
                      f"{first_words(e)}). Give a torch.utils.data.Dataset with __len__ and __getitem__, or an "
                      f"IterableDataset."]
    if not got:
        return None, [f"{key} ({source}): {spec['_target_']} has no items. Give a non-empty dataset."]
    why = item_problem(got[0], keys, collate)
    if why:
        return None, [f"{key} ({source}): item 0 of {spec['_target_']} {why}."]
    return ds, []


def first_items(dataset: Any, count: int) -> list[Any]:
    """The dataset's first ``count`` items (fewer when it has fewer): by index, or by iterating a stream (in a random
    state of its own, as the ranks read it)."""
    import itertools

    from launcher.usercode.data import is_stream
    from launcher.usercode.loading import own_random_state

    if is_stream(dataset):
        with own_random_state():
            return list(itertools.islice(iter(dataset), count))
    return [dataset[i] for i in range(min(count, len(dataset)))]


def read_time(dataset: Any, count: int = 16) -> tuple[float, float]:
    """(median seconds to read one item, the share of the reading spent on a CPU) over the dataset's first ``count``
    items after the first (which may warm caches): what loader.num_workers=auto decides by."""
    import itertools
    import statistics
    import time

    from launcher.usercode.data import is_stream
    from launcher.usercode.loading import own_random_state

    with own_random_state():
        source = iter(dataset) if is_stream(dataset) else (dataset[i] for i in range(min(count + 1, len(dataset))))
        next(source, None)
        walls, cpu, start = [], time.process_time(), time.perf_counter()
        last = start
        for _ in itertools.islice(source, count):
            now = time.perf_counter()
            walls.append(now - last)
            last = now
        cpu, wall = time.process_time() - cpu, last - start
    if not walls:
        return 0.0, 1.0
    return statistics.median(walls), min(1.0, cpu / wall) if wall > 0 else 1.0


def two_items(dataset: Any, keys: Keys, collate: Any = None) -> tuple[Any, Any]:
    """The dataset's first two items batched as the ranks' DataLoader does: (inputs, label)."""
    return split_item(collate_of(collate)(first_items(dataset, 2)), *keys)


def first_labels(dataset: Any, keys: Keys, count: int, collate: Any = None) -> list:
    """The labels of the first ``count`` items, each batched alone as the ranks' DataLoader batches it."""
    batch = collate_of(collate)
    return [split_item(batch([item]), *keys)[1] for item in first_items(dataset, count)]
