"""data.val_fraction of a tabular file: a validation split carved from the train split.

The rows of a file are split once, seeded: ``test_fraction`` of them are the test split, and ``val_fraction`` of
them (of the file's rows, so 0.2 and 0.1 leave 70 % to train) are taken from the train split's rows — the first of
its already shuffled rows, so no other draw is made and a run without a validation split keeps exactly the rows it
had. As Keras' ``validation_split``, the validation rows are encoded with the train split's vocabularies and
standardised with its statistics, which they took part in; their labels never do.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch


def val_rows(train_rows: int, test_rows: int, val_fraction: float) -> int:
    """Rows of the validation split (0 when val_fraction is 0)."""
    if val_fraction <= 0:
        return 0
    return max(1, int(round((train_rows + test_rows) * val_fraction)))


def val_problems(path: str, train_rows: int, test_rows: int, val_fraction: float, test_fraction: float) -> list[str]:
    """What is wrong with data.val_fraction for a file of these splits ([] when nothing is)."""
    if val_fraction == 0:
        return []
    if not 0 < val_fraction < 1 or val_fraction + test_fraction >= 1:
        return [f"data.val_fraction={val_fraction} must be between 0 and 1 - data.test_fraction ({test_fraction}), "
                f"so that rows are left to train on (e.g. data.val_fraction=0.1); 0 = no validation split."]
    if val_rows(train_rows, test_rows, val_fraction) >= train_rows:
        return [f"data.path={path}: {train_rows + test_rows} rows leave nothing to train on with data.val_fraction="
                f"{val_fraction} and data.test_fraction={test_fraction}. Lower data.val_fraction."]
    return []


def carve(train: tuple[torch.Tensor, ...], test_rows: int, val_fraction: float
          ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """(the train split without the validation rows, the validation split or None): the first val_rows of the
    train split's tensors (rows are in a seeded random order already) become the validation split."""
    n = val_rows(len(train[-1]), test_rows, val_fraction)
    if n == 0:
        return train, None
    return tuple(t[n:] for t in train), tuple(t[:n] for t in train)


def held_out(split: tuple[torch.Tensor, ...], dp_rank: int, dp_size: int, micro_size: int) -> Iterator[tuple]:
    """A held-out split (dense, ids, labels), each data-parallel rank a disjoint part, micro_size rows at a time."""
    dense, ids, y = split
    mine = torch.arange(dp_rank, len(y), dp_size)
    # The same number of batches on every rank (ZeRO-3 gathers parameters collectively in each forward).
    batches = max(1, math.ceil(math.ceil(len(y) / dp_size) / micro_size))
    for idx in torch.tensor_split(mine, batches):
        yield (dense[idx], ids[idx].long()), y[idx]
