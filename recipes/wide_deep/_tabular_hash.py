"""data.hash_buckets for recipes/wide_deep/tabular.py: categorical columns hashed straight from their raw values, in
bounded batches, with no vocabulary; hash collisions counted in memory proportional to the buckets.

``_prepare_hashed`` streams the file in batches (``read_batches``) and hashes each batch's values as they come, row
1 + blake2b-64(text) mod (hash_buckets - 1), row 0 for a missing value, so no dictionary of a whole column is ever
held. A column is typed by data.continuous / data.categorical, a Parquet number type, else its first TYPE_ROWS rows
(``tabular.TYPE_ROWS``, read from there at call time). The launcher's pass counts collisions per field in memory
proportional to hash_buckets, never to the values (``Occupancy`` -> ``Collisions``: buckets used, distinct values
estimated by linear counting, rows in a bucket two values share); ``collision_lines`` words them for the plan.

What both modes share (``TabularError``, ``Prepared``, the split, standardising, typing) is in tabular.py, which
imports this module when hash_buckets > 0 and re-exports ``Collisions``, ``Occupancy`` and ``collision_lines``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from launcher.recipes.wide_deep import tabular
from launcher.recipes.wide_deep._tabular_columns import Finite
from launcher.recipes.wide_deep._tabular_read import Coded, ReadError, _bytes, read_batches
from launcher.recipes.wide_deep.tabular import (DENSE, IDS, LABELS, Prepared, TabularError, _check_labels, _cross,
                                                _float_lut, _is_numeric, _prepared, _split, _standardised,
                                                is_positive)

LABEL_VALUES = 1024
"""data.hash_buckets: distinct values of the label column held at most (a label has two)."""


def _hashes(texts: list[str]) -> np.ndarray:
    """uint64 per text: blake2b-64 of its UTF-8 bytes, little-endian (the number ``_bucket`` takes apart)."""
    digest = hashlib.blake2b
    return np.frombuffer(b"".join([digest(v.encode(), digest_size=8).digest() for v in texts]), "<u8")


def bucket_ids(texts: list[str], buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 row of each text: 1 + blake2b-64 mod (buckets - 1), 0 for "" (missing); its uint64 hash)."""
    hashes = _hashes(texts)
    ids = (hashes % np.uint64(buckets - 1)).astype(np.int32) + 1
    ids[np.fromiter((t == "" for t in texts), bool, len(texts))] = 0
    return ids, hashes


def _prepare_hashed(p: Path, names, label, positive, negative, categorical, continuous, drop, test_fraction,
                    crosses, seed, buckets, tensors) -> Prepared:
    """data.hash_buckets: the file streamed once in batches (``read_batches``), each batch's values hashed as it
    comes (row = 1 + blake2b-64(text) mod (buckets - 1); a missing value, "" or null, and a cross with a missing
    side -> row 0), so no dictionary of a whole column is ever held. Typing: data.continuous, then data.categorical,
    then a Parquet number column (continuous), else the first TYPE_ROWS rows (continuous when every non-empty
    value there is a number; a later non-number in such a column is refused with the fix). A rank keeps per row a
    float32 per continuous column, an int32 id per field and a label; ``tensors=False`` keeps an ``Occupancy`` per
    field instead (13 bytes per bucket) for ``Prepared.collisions``."""
    path = str(p)
    features = [h for h in names if h != label and h not in drop]
    if not features and not crosses:
        raise TabularError([f"data.path={path}: no feature columns left after data.label and data.drop."])
    text = {label, *categorical, *{c for pair in crosses for c in pair}}
    skip = {h for h in drop if h not in text}  # data.continuous read too: the launcher refuses an inf in it
    fixed = {h: h in continuous for h in features if h in continuous or h in categorical}
    fold = _HashedRead(path, label, positive, features, fixed, crosses, buckets, tensors)
    try:
        read = read_batches(p, text, skip, fold)
    except ReadError as e:
        raise TabularError([e.problem]) from None
    if not read.rows:
        raise TabularError([f"data.path={path}: the file has no data rows. Give a file with a header line and rows."])
    _check_labels(label, positive, negative, sorted(read.labels))
    y = torch.from_numpy(np.frombuffer(read.y, np.uint8).astype(np.float32)).to(LABELS)
    train_idx, test_idx = _split(path, read.rows, test_fraction, seed)
    prepared = _prepared(p, read.cont, read.cats, crosses, y, train_idx, test_idx, read.reader)
    prepared.field_sizes = [buckets] * len(read.fields)
    if not tensors:
        prepared.collisions = [read.stats.pop(f).figures(f, read.rows) for f in read.fields]
        return prepared
    train_np, test_np = train_idx.numpy(), test_idx.numpy()
    dense = (torch.zeros(len(train_idx), len(read.cont), dtype=DENSE),
             torch.zeros(len(test_idx), len(read.cont), dtype=DENSE))
    for j, h in enumerate(read.cont):
        dense[0][:, j], dense[1][:, j] = _standardised(torch.from_numpy(np.frombuffer(read.dense.pop(h), np.float32)),
                                                       train_idx, test_idx)
    ids = (torch.zeros(len(train_idx), len(read.fields), dtype=IDS),
           torch.zeros(len(test_idx), len(read.fields), dtype=IDS))
    for j, f in enumerate(read.fields):
        col = np.frombuffer(read.ids.pop(f), np.int32)
        ids[0][:, j], ids[1][:, j] = torch.from_numpy(col[train_np]), torch.from_numpy(col[test_np])
    prepared.train, prepared.test = (dense[0], ids[0], y[train_idx]), (dense[1], ids[1], y[test_idx])
    return prepared


class _HashedRead:
    """A fold for ``read_batches`` (a fresh one per call): the label, continuous columns and hashed ids of each
    batch appended as it comes. Keeps per row a label byte and, for a rank, a float32 per continuous column and an
    int32 id per field; for the launcher an ``Occupancy`` per field. Nothing per distinct value."""

    def __init__(self, path, label, positive, features, fixed, crosses, buckets, tensors) -> None:
        self.path, self.label, self.positive, self.features, self.fixed = path, label, positive, features, fixed
        self.crosses, self.buckets, self.tensors = crosses, buckets, tensors

    def __call__(self, names: list[str], reader: str, batches: Iterator) -> _HashedRead:
        self.reader, self.rows, self.labels, self.y = reader, 0, set(), array("B")
        numeric, batches = _typed(batches, [h for h in self.features if h not in self.fixed])
        self.cont = [h for h in self.features if self.fixed.get(h, numeric.get(h))]
        self.cats = [h for h in self.features if h not in self.cont]
        self.fields = self.cats + [f"{a}|{b}" for a, b in self.crosses]
        self.dense = {h: array("f") for h in self.cont} if self.tensors else {}
        self.ids = {f: array("i") for f in self.fields} if self.tensors else {}
        self.stats = {} if self.tensors else {f: Occupancy(self.buckets) for f in self.fields}
        self.finite = Finite(f"data.path={self.path}")
        for n, cols in batches:
            self._add(cols)
            self.rows += n
        self.finite.check()
        return self

    def _add(self, cols: dict) -> None:
        label = cols[self.label]
        texts = label.texts()
        self.labels.update(texts)
        if len(self.labels) > LABEL_VALUES:
            raise TabularError([f"data.label={self.label}: has more than {LABEL_VALUES:,} distinct values; a label "
                                f"has two (data.positive, data.negative). Name the click column in data.label."])
        self.y.frombytes(_bytes(np.array([is_positive(t, self.positive) for t in texts], np.uint8)[label.codes]))
        for h in self.cont:
            col = cols[h]
            floats = col if isinstance(col, np.ndarray) else self._floats(h, col)
            self.finite.add(h, floats, self.rows + 1)
            if self.tensors and not self.finite.seen:  # once one is seen, the read ends refused
                self.dense[h].frombytes(_bytes(floats.astype(np.float32)))
        crossed = [_cross(cols[a], cols[b], hashed=True) for a, b in self.crosses]
        for f, col in zip(self.fields, [cols[h] for h in self.cats] + crossed):
            texts = col.texts()
            ids, hashes = bucket_ids(texts, self.buckets)
            if self.tensors:
                self.ids[f].frombytes(_bytes(ids[col.codes]))
            else:
                rows = np.bincount(col.codes, minlength=len(texts))
                self.stats[f].add(ids, (hashes >> np.uint64(32)).astype(np.uint32), rows)

    def _floats(self, h: str, col: Coded) -> np.ndarray:
        lut, bad = _float_lut(col)
        if bad >= 0 and h not in self.fixed:
            row = self.rows + 1 + int(np.flatnonzero(col.codes == bad)[0])
            raise TabularError([
                f"data.path={self.path}: column {h!r} holds only numbers in its first {tabular.TYPE_ROWS:,} rows, so "
                f"data.hash_buckets typed it continuous, but data row {row:,} holds {col.texts(bad, bad + 1)[0]!r}. "
                f"Set data.categorical=[{h}] to hash it, or data.continuous=[{h}] to read such values as missing."])
        return lut[col.codes]


def _typed(batches: Iterator, columns: list[str]) -> tuple[dict[str, bool], Iterator]:
    """({column: every non-empty value of its first TYPE_ROWS rows is a number}, the same batches from the first):
    the batches that hold those rows are read ahead and kept (a bounded number of rows)."""
    ahead, seen = [], 0
    for batch in batches:
        ahead.append(batch)
        seen += batch[0]
        if seen >= tabular.TYPE_ROWS:
            break
    numeric = {}
    for h in columns:
        left, numeric[h] = tabular.TYPE_ROWS, True
        for n, cols in ahead:
            col = cols[h]
            if left <= 0 or isinstance(col, np.ndarray) or not numeric[h]:
                break
            if n > left:  # only the values of the rows up to TYPE_ROWS
                used = np.unique(col.codes[:left])
                col = Coded(col.codes[:0], [col.uniques[i] for i in used.tolist()] if isinstance(col.uniques, list)
                            else col.uniques.take(used))
            numeric[h], left = _is_numeric(col), left - n
    return numeric, itertools.chain(ahead, batches)


class Occupancy:
    """What hashing does to one field, in memory that grows with its buckets (13 bytes each), never with its values:
    rows per bucket; per bucket a 32-bit fingerprint (the high half of the 64-bit hash) of the first value seen,
    and whether a value with another fingerprint came (two values share it: exact but for fingerprint ties, about
    one in 4 billion per pair)."""

    def __init__(self, buckets: int) -> None:
        self.rows = np.zeros(buckets, np.int64)
        self.first = np.zeros(buckets, np.uint32)
        self.shared = np.zeros(buckets, bool)

    def add(self, ids: np.ndarray, fingerprints: np.ndarray, rows: np.ndarray) -> None:
        """A batch's distinct values: the bucket of each (0 = missing), its fingerprint, its rows in the batch."""
        new = self.rows[ids] == 0
        self.first[ids[new]] = fingerprints[new]  # two new values in one bucket: the last wins, the other differs
        self.shared[ids[self.first[ids] != fingerprints]] = True
        np.add.at(self.rows, ids, rows)

    def figures(self, field: str, rows: int) -> Collisions:
        values = self.rows[1:]  # row 0 holds the missing values, never a collision
        shared = self.shared[1:]
        return Collisions(field, len(self.rows), int(np.count_nonzero(values)), int(np.count_nonzero(shared)),
                          rows, int(self.rows[0]), int(values[shared].sum()))


@dataclass(frozen=True)
class Collisions:
    """Hash collisions of one field over the whole file (train and test rows), from the launcher's pass."""

    field: str
    buckets: int
    """Rows of the field (data.hash_buckets): row 0 for a missing value, the other buckets - 1 for values."""
    used: int
    """Value buckets that some row hashed to (K of buckets - 1)."""
    shared: int
    """Value buckets that two or more distinct values hashed to."""
    rows: int
    missing_rows: int
    """Rows with a missing value (row 0)."""
    shared_rows: int
    """Rows whose bucket holds two or more distinct values."""

    @property
    def distinct(self) -> float:
        """Estimated distinct values (linear counting, Whang et al. 1990): -m ln(1 - K/m), m = buckets - 1; inf
        once every bucket is used (then only "more than about m ln m" is known)."""
        m = self.buckets - 1
        return math.inf if self.used >= m else -m * math.log1p(-self.used / m)

    @property
    def sharing(self) -> float:
        """Estimated distinct values that share their bucket with another: n - K + (buckets holding 2+)."""
        return self.distinct - self.used + self.shared

    def line(self) -> str:
        m = self.buckets - 1
        values = (f"~{_count(self.distinct)} distinct values, ~{_count(self.sharing)} of them share a bucket"
                  if self.used < m else f"more than ~{_count(m * math.log(max(m, 2)))} distinct values (every bucket "
                                        f"used)")
        missing = f"; {self.missing_rows / self.rows:.1%} of rows missing (row 0)" if self.missing_rows else ""
        return (f"{self.field}: {self.shared_rows / self.rows:.1%} of rows in a shared bucket ({self.shared:,} "
                f"buckets hold 2+ values); {self.used:,} of {m:,} buckets used; estimated {values}{missing}")


def _count(x: float) -> str:
    return "?" if math.isinf(x) else f"{x / 1e6:.1f} M" if x >= 1e6 else f"{x:,.0f}"


def collision_lines(prepared: Prepared, most: int = 8) -> list[str]:
    """The data.hash_buckets figures for the plan: a line per field, the worst (most rows in a shared bucket)
    first, at most ``most`` of them; [] without hashing."""
    worst = sorted(prepared.collisions, key=lambda c: (-c.shared_rows, c.field))
    if not worst:
        return []
    lines = [f"data.hash_buckets={worst[0].buckets:,}: hash collisions of {len(worst)} field(s) over the file's "
             f"{worst[0].rows:,} rows, worst first (distinct values estimated from the buckets used, by linear "
             f"counting):"]
    lines += [f"  {c.line()}" for c in worst[:most]]
    if len(worst) > most:
        lines.append(f"  ... {len(worst) - most} more field(s), each with at most "
                     f"{worst[most].shared_rows / worst[most].rows:.1%} of rows in a shared bucket")
    return lines
