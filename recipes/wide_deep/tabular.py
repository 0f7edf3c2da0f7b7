"""A user's tabular CTR file (CSV, gzip'd CSV or Parquet) as Wide&Deep inputs.

Columns with non-numeric values are categorical, numeric ones continuous (``categorical`` / ``continuous`` say
otherwise; ``drop`` removes columns). A seeded split keeps ``test_fraction`` of the rows for evaluation (and
``val_fraction`` for validation: recipes/wide_deep/_tabular_val.py). Continuous
columns are standardised with train statistics (missing -> the train mean; inf, -inf or a value beyond float32 is
refused: ``Finite``); categorical vocabularies come from the train split, index 0 is the out-of-vocabulary
bucket, and a column with more than ``max_vocab`` distinct values is hashed into ``max_vocab`` buckets. ``crosses``
add categorical fields made of value pairs (a|b).

The file is read column by column (recipes/wide_deep/_tabular_read.py: pyarrow when installed, else Python's csv
module a chunk of rows at a time); every column is dictionary-encoded, so typing, vocabularies and hashing work on
each column's distinct values, never on a Python string per cell. The launcher asks only for the facts (columns,
row counts, vocabulary sizes: ``prepare(..., tensors=False)``); every rank prepares the tensors itself, identically
(same seed), keeps the train split (float32 continuous, int32 ids, float32 labels; each epoch reshuffles all of it
over the ranks) and the test split, and reads only its shard of each epoch.

``hash_buckets`` > 0 builds no vocabulary (recipes/wide_deep/_tabular_hash.py, imported only then): each pass streams
the file in batches and hashes each batch's values as they come, row 1 + blake2b-64(text) mod (hash_buckets - 1), row
0 for a missing value; a column is typed by data.continuous / data.categorical, a Parquet number type, else its first
TYPE_ROWS rows. The launcher's pass counts collisions per field in memory proportional to hash_buckets (``Occupancy``
-> ``Collisions``, ``collision_lines``: importable from here). A ``max_vocab`` other than its default is refused with
it (it would do nothing).
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from launcher.recipes.wide_deep._tabular_columns import (TabularError, _check_labels, Finite,  # noqa: F401
                                                        id_columns, is_positive)
from launcher.recipes.wide_deep._tabular_val import carve, held_out
from launcher.recipes.wide_deep._tabular_read import INSTALL, Coded, ReadError, compact, header, is_streamed, read_table

if TYPE_CHECKING:
    from launcher.recipes.wide_deep._tabular_hash import Collisions


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _bucket(value: str, buckets: int) -> int:
    return 1 + int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little") % (buckets - 1)


BIG = 32 << 20
"""A file this big (bytes) read without pyarrow gets a note on installing it."""
BLOCK = 1 << 16
"""Distinct values turned into Python strings at a time (number checks, hashing)."""
MAX_VOCAB = 100_000
"""data.max_vocab's default; with data.hash_buckets another value is refused (it would do nothing)."""
MAX_ROWS = 2**31 - 1
"""Most rows of a hashed field: ids are int32."""
TYPE_ROWS = 65536
"""data.hash_buckets: a column that data.categorical / data.continuous do not name (and that is not a Parquet number
column) is typed from its first TYPE_ROWS rows: continuous when every non-empty value there is a number."""

def _blocks(col: Coded) -> Iterator[tuple[int, list[str]]]:
    for start in range(0, len(col), BLOCK):
        yield start, col.texts(start, start + BLOCK)


def _is_numeric(col) -> bool:
    """Every non-empty value of the column parses as a number (Python's float())."""
    if isinstance(col, np.ndarray):
        return True
    if not isinstance(col.uniques, list) and _arrow_floats(col.uniques) is not None:
        return True
    return all(_is_number(v) for _, texts in _blocks(col) for v in texts if v != "")


def _arrow_floats(uniques) -> np.ndarray | None:
    """pyarrow's parse of each value as float64 ("" -> NaN); None when one does not parse (Python's float() is
    then asked: it also takes e.g. "1_000")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        for part in (uniques.slice(0, 1024), uniques):  # most text columns fail on their first values
            parsed = pc.cast(pc.if_else(pc.equal(part, ""), pa.scalar(None, pa.string()), part), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return parsed.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _floats(col) -> np.ndarray:
    """float64 per row; NaN for a missing or non-numeric value."""
    return col if isinstance(col, np.ndarray) else _float_lut(col)[0][col.codes]


def _float_lut(col: Coded) -> tuple[np.ndarray, int]:
    """(float64 per distinct value, NaN for "" or a non-number; the index of the first non-number, -1 if none)."""
    lut = None if isinstance(col.uniques, list) else _arrow_floats(col.uniques)
    if lut is not None:
        return lut, -1
    lut, bad = np.full(len(col), np.nan), -1
    for start, texts in _blocks(col):
        for k, v in enumerate(texts):
            if v != "" and _is_number(v):
                lut[start + k] = float(v)
            elif v != "" and bad < 0:
                bad = start + k
    return lut, bad


def _cross(a: Coded, b: Coded, hashed: bool = False) -> Coded:
    """The field of value pairs "a|b" (pairs that read the same, e.g. x|y + z and x + y|z, are one value). hashed
    (a batch's pairs, to be hashed): a pair with a missing side is "" (missing), and equal texts are not merged."""
    pairs, codes = np.unique(a.codes.astype(np.int64) * len(b) + b.codes, return_inverse=True)
    ta, tb = a.texts(), b.texts()
    pair = [(ta[p // len(b)], tb[p % len(b)]) for p in pairs.tolist()]
    texts = ["" if hashed and "" in (x, y) else f"{x}|{y}" for x, y in pair]
    codes = codes.astype(np.int32).reshape(-1)
    return Coded(codes, texts) if hashed else compact(codes, texts)


def _vocabulary(col: Coded, train: np.ndarray, max_vocab: int, lookup: bool) -> tuple[int, np.ndarray | None]:
    """(rows of the field, id per distinct value or None when not lookup): train values in sorted order from 1
    (0 = out of vocabulary), or all values hashed into max_vocab buckets when the train split has more."""
    seen = np.flatnonzero(np.bincount(col.codes[train], minlength=len(col)))
    if len(seen) + 1 > max_vocab:
        if not lookup:
            return max_vocab, None
        lut = np.empty(len(col), np.int32)
        for start, texts in _blocks(col):
            lut[start : start + len(texts)] = [_bucket(v, max_vocab) for v in texts]
        return max_vocab, lut
    if not lookup:
        return len(seen) + 1, None
    if isinstance(col.uniques, list):
        order = sorted(seen.tolist(), key=col.uniques.__getitem__)
    else:  # pyarrow sorts UTF-8 bytewise: the order of code points, as Python's sorted()
        import pyarrow as pa
        import pyarrow.compute as pc

        order = seen[pc.sort_indices(col.uniques.take(pa.array(seen))).to_numpy()]
    lut = np.zeros(len(col), np.int32)
    lut[np.asarray(order, dtype=np.int64)] = np.arange(1, len(seen) + 1, dtype=np.int32)
    return len(seen) + 1, lut


@dataclass
class Prepared:
    continuous: list[str]
    categorical: list[str]
    field_sizes: list[int]
    train_rows: int
    test_rows: int
    train_positive: float
    """Share of positive labels in the train split."""
    reader: str
    """What read the file ("pyarrow" or "Python's csv module")."""
    note: str = ""
    """For the data line: how to read a big file faster, when that is pyarrow and it is missing."""
    train: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """(dense float32, ids int32, labels float32); None from prepare(tensors=False)."""
    test: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    collisions: list[Collisions] = field(default_factory=list)
    """data.hash_buckets, ``prepare(tensors=False)``: what hashing did to each field; empty otherwise."""

    def resident_bytes(self) -> int:
        """Bytes of the tensors a rank keeps for the run, ``train`` and ``test`` (known from the facts alone): per
        row, a float32 per continuous column, an int32 id per categorical field, a float32 label. The file's
        encoded columns (codes and dictionaries) are gone once ``prepare`` returns."""
        per_row = len(self.continuous) * DENSE.itemsize + len(self.categorical) * IDS.itemsize + LABELS.itemsize
        return (self.train_rows + self.test_rows) * per_row


DENSE, IDS, LABELS = torch.float32, torch.int32, torch.float32
"""The dtypes of what a rank keeps of each split: continuous columns, categorical ids, labels."""


def prepare(path: str, label: str, positive: str, negative: str = "", categorical=(), continuous=(), drop=(),
            test_fraction: float = 0.2, max_vocab: int = MAX_VOCAB, crosses=(), seed: int = 0, hash_buckets: int = 0,
            tensors: bool = True) -> Prepared:
    """The file's columns typed, split and encoded; ``tensors=False``: the same facts without the tensors.
    ``hash_buckets`` > 0: every categorical field hashed into that many rows as the file streams by (see
    ``_prepare_hashed``); 0: vocabularies from the train split (``max_vocab``)."""
    config = _hash_problems(hash_buckets, max_vocab)
    p = Path(path)
    if not p.is_file():
        raise TabularError([*config, f"data.path={path}: no such file (relative paths start at {Path.cwd()}). "
                                     f"Give a CSV, .csv.gz or Parquet file."])
    if config:
        raise TabularError(config)
    no_rows = f"data.path={path}: the file has no data rows. Give a file with a header line and rows."
    try:
        names = header(p)
    except ReadError as e:
        raise TabularError([e.problem]) from None
    if not names:
        raise TabularError([no_rows])
    problems = _key_problems(path, names, label, categorical, continuous, drop, crosses, test_fraction, max_vocab)
    ids = id_columns(names, label, categorical, continuous, drop)
    categorical = [*categorical, *ids]
    prepared = _prepare(p, names, label, positive, negative, categorical, continuous, drop, test_fraction, max_vocab,
                        crosses, seed, hash_buckets, tensors, problems, no_rows)
    if ids:
        said = (f"{', '.join(ids)} categorical: named as ids (data.continuous=[{ids[0]}] would keep "
                f"{'it a number' if len(ids) == 1 else 'one a number'})")
        prepared.note = f"{prepared.note}; {said}" if prepared.note else said
    return prepared


def _prepare(p, names, label, positive, negative, categorical, continuous, drop, test_fraction, max_vocab, crosses,
             seed, hash_buckets, tensors, problems, no_rows) -> Prepared:
    """prepare's reading: hashed (hash_buckets > 0) or with vocabularies."""
    path = str(p)
    if hash_buckets:
        if problems:  # before reading the whole file
            raise TabularError(problems)
        from launcher.recipes.wide_deep._tabular_hash import _prepare_hashed  # it builds on this module

        return _prepare_hashed(p, names, label, str(positive), negative, list(categorical), list(continuous),
                               list(drop), test_fraction, list(crosses), seed, hash_buckets, tensors)
    crossed = {c for pair in crosses for c in pair}
    text = {label, *categorical, *crossed}
    try:
        table = read_table(p, text, skip={h for h in drop if h not in text})
    except ReadError as e:
        raise TabularError([e.problem]) from None
    if not table.rows:
        raise TabularError([no_rows])
    if problems:
        raise TabularError(problems)
    return _prepare_vocab(p, names, table, label, str(positive), negative, categorical, continuous, drop,
                          test_fraction, max_vocab, crosses, seed, tensors)


def _prepare_vocab(p: Path, names, table, label, positive, negative, categorical, continuous, drop, test_fraction,
                   max_vocab, crosses, seed, tensors) -> Prepared:
    """data.hash_buckets=0: the whole file's columns (``read_table``), vocabularies from the train split."""
    path = str(p)
    cols = table.columns

    labels = cols[label]
    positive = _check_labels(label, positive, negative, sorted(labels.texts()))
    features = [h for h in names if h != label and h not in drop]
    cont = [h for h in features if h in continuous or (h not in categorical and _is_numeric(cols[h]))]
    cats = [h for h in features if h not in cont]
    if not cont and not cats and not crosses:
        raise TabularError([f"data.path={path}: no feature columns left after data.label and data.drop."])
    finite = Finite(f"data.path={path}")  # inf would make a column's statistics, then every value, NaN
    for h in cont:
        finite.add(h, _floats(cols[h]))
    finite.check()
    y = torch.from_numpy((labels.codes == labels.texts().index(positive)).astype(np.float32)).to(LABELS)
    train_idx, test_idx = _split(path, table.rows, test_fraction, seed)
    train_np = train_idx.numpy()
    fields = [cols[h] for h in cats] + [_cross(cols[a], cols[b]) for a, b in crosses]
    prepared = _prepared(p, cont, cats, crosses, y, train_idx, test_idx, table.reader)
    if not tensors:
        prepared.field_sizes = [_vocabulary(f, train_np, max_vocab, lookup=False)[0] for f in fields]
        return prepared

    dense = (torch.zeros(len(train_idx), len(cont), dtype=DENSE), torch.zeros(len(test_idx), len(cont), dtype=DENSE))
    for j, h in enumerate(cont):
        dense[0][:, j], dense[1][:, j] = _standardised(torch.from_numpy(_floats(cols.pop(h)).astype(np.float32)),
                                                       train_idx, test_idx)
    ids = (torch.zeros(len(train_idx), len(fields), dtype=IDS), torch.zeros(len(test_idx), len(fields), dtype=IDS))
    for j, f in enumerate(fields):
        size, lut = _vocabulary(f, train_np, max_vocab, lookup=True)
        prepared.field_sizes.append(size)
        ids[0][:, j] = torch.from_numpy(lut[f.codes[train_np]])
        ids[1][:, j] = torch.from_numpy(lut[f.codes[test_idx.numpy()]])
    prepared.train = (dense[0], ids[0], y[train_idx])
    prepared.test = (dense[1], ids[1], y[test_idx])
    return prepared


def _key_problems(path, names, label, categorical, continuous, drop, crosses, test_fraction, max_vocab) -> list[str]:
    problems = []
    named = [("data.label", [label]), ("data.categorical", categorical), ("data.continuous", continuous),
             ("data.drop", drop), ("data.crosses", [c for pair in crosses for c in pair])]
    for key, cols in named:
        for c in cols:
            if c not in names:
                problems.append(f"{key}: column {c!r} is not in {path}. Its columns: {', '.join(names)}.")
    if not 0 < test_fraction < 1:
        problems.append(f"data.test_fraction={test_fraction} must be between 0 and 1 (e.g. 0.2).")
    if max_vocab < 2:
        problems.append(f"data.max_vocab={max_vocab} must be >= 2.")
    return problems


def _split(path: str, n: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train rows, test rows): a seeded permutation of the n rows, its first test_fraction the test split."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = max(1, int(round(n * test_fraction)))
    if n_test >= n:
        raise TabularError([f"data.path={path}: {n} rows leave nothing to train on with data.test_fraction="
                            f"{test_fraction}."])
    return order[n_test:], order[:n_test]


def _prepared(p: Path, cont, cats, crosses, y, train_idx, test_idx, reader: str) -> Prepared:
    """The facts both modes share (field_sizes still empty)."""
    names = cats + [f"{a}|{b}" for a, b in crosses]
    prepared = Prepared(cont, names, [], len(train_idx), len(test_idx), float(y[train_idx].mean()), reader)
    if reader != "pyarrow" and p.stat().st_size > BIG:
        prepared.note = f"read by {reader}; {INSTALL} reads a file this big several times faster"
    return prepared


def _standardised(t: torch.Tensor, train_idx, test_idx) -> tuple[torch.Tensor, torch.Tensor]:
    """A continuous column (float32 per row, NaN = missing) -> (train, test) standardised with the train mean and
    standard deviation; a missing value becomes the train mean (0 after standardising)."""
    train_vals = t[train_idx]
    ok = ~torch.isnan(train_vals)
    mean = train_vals[ok].mean() if ok.any() else torch.tensor(0.0)
    std = train_vals[ok].std() if ok.sum() > 1 else torch.tensor(1.0)
    t = torch.where(torch.isnan(t), mean, t)
    t = (t - mean) / (std if std > 0 else 1.0)
    return t[train_idx], t[test_idx]


def _hash_problems(hash_buckets, max_vocab: int) -> list[str]:
    if isinstance(hash_buckets, bool) or not isinstance(hash_buckets, numbers.Integral):
        return [f"data.hash_buckets={hash_buckets!r} is not a whole number of rows. Set e.g. "
                f"data.hash_buckets=1000000 (rows per categorical field), or 0 to build vocabularies."]
    if hash_buckets and not 2 <= hash_buckets <= MAX_ROWS:
        return [f"data.hash_buckets={hash_buckets} must be between 2 and {MAX_ROWS:,} rows per field (row 0 is a "
                f"missing value's, ids are int32), or 0 to build vocabularies. Set e.g. data.hash_buckets=1000000."]
    if hash_buckets and max_vocab != MAX_VOCAB:
        return [f"data.max_vocab={max_vocab} does nothing with data.hash_buckets={hash_buckets}: every categorical "
                f"column is hashed into data.hash_buckets rows and none gets a vocabulary. Remove data.max_vocab, "
                f"or set data.hash_buckets=0 to build vocabularies."]
    return []


_HASHED = ("Collisions", "Occupancy", "collision_lines")
"""The public names of recipes/wide_deep/_tabular_hash.py, importable from here as before it was split off."""


def __getattr__(name: str):
    """``from ...tabular import Collisions`` and the like (PEP 562): _tabular_hash imports this module, so this one
    imports it only when asked, never while either is being loaded."""
    if name in _HASHED:
        from launcher.recipes.wide_deep import _tabular_hash

        return getattr(_tabular_hash, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TabularCTR:
    """The data source of data=tabular: one file's splits in memory, or a directory or glob streamed by row group."""

    def __init__(self, path: str, label: str, positive: str, negative: str, categorical, continuous, drop,
                 test_fraction: float, max_vocab: int, crosses, seed: int, hash_buckets: int = 0, eval_path: str = "",
                 shuffle_rows: int = 0, prefetch: int = 1, val_fraction: float = 0.0) -> None:
        self.prepared = self.stream = self.val = None
        if is_streamed(path):  # a directory or glob: each rank streams its own row groups (_tabular_stream.py)
            from launcher.recipes.wide_deep._tabular_stream import StreamedTabular

            self.stream = StreamedTabular.of(path, label, positive, negative, categorical, continuous, drop,
                                             test_fraction, max_vocab, crosses, seed, hash_buckets, eval_path,
                                             shuffle_rows, prefetch)
            return
        self.prepared = prepare(path, label, str(positive), str(negative), list(categorical), list(continuous),
                                list(drop), test_fraction, max_vocab, [list(c) for c in crosses], seed, hash_buckets)
        self.prepared.train, self.val = carve(self.prepared.train, self.prepared.test_rows, val_fraction)

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[tuple]:
        if self.stream is not None:
            return (yield from self.stream.train_batches(dp_rank, dp_size, micro_size, seed, start))
        dense, ids, y = self.prepared.train
        group = micro_size * dp_size
        per_epoch = len(y) // group
        epoch, skip = divmod(start, per_epoch)
        while True:  # DistributedSampler semantics: disjoint shards, reshuffled each epoch, last partial group dropped
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + epoch))
            for k in range(skip, per_epoch):
                idx = order[k * group + dp_rank * micro_size : k * group + (dp_rank + 1) * micro_size]
                yield (dense[idx], ids[idx].long()), y[idx]
            epoch, skip = epoch + 1, 0

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        """The whole test split (count is ignored), each data-parallel rank a disjoint part, micro_size rows at a
        time."""
        if self.stream is not None:
            return (yield from self.stream.eval_batches(dp_rank, dp_size, micro_size, count))
        yield from held_out(self.prepared.test, dp_rank, dp_size, micro_size)

    def val_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        """The whole validation split (data.val_fraction), as eval_batches gives the test split."""
        yield from held_out(self.val, dp_rank, dp_size, micro_size)

