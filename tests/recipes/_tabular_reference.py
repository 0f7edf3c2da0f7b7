"""The per-cell reader data=tabular had before the column-wise one (commit 34fb0cd, recipes/wide_deep/tabular.py),
kept verbatim as the reference the new reader must agree with (tests/recipes/test_tabular.py). Not used by the
launcher."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import torch


class TabularError(ValueError):
    """Problems with the user's file or columns; each entry names the key, the value and a fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _read(path: Path) -> tuple[list[str], list[list[str]]]:
    name = path.name.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise TabularError([f"data.path={path}: reading Parquet needs pyarrow. Install it: pip install pyarrow"]) from None
        table = pq.read_table(path)
        header = table.column_names
        cols = [["" if v is None else str(v) for v in table.column(c).to_pylist()] for c in header]
        return header, [list(r) for r in zip(*cols)]
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8-sig", errors="replace")
    sample = text[:65536]
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
    rows = [r for r in reader if r and any(c.strip() for c in r)]
    if not rows:
        return [], []
    return [h.strip() for h in rows[0]], [[c.strip() for c in r] for r in rows[1:]]


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _bucket(value: str, buckets: int) -> int:
    return 1 + int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little") % (buckets - 1)


@dataclass
class Prepared:
    continuous: list[str]
    categorical: list[str]
    field_sizes: list[int]
    train: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    """(dense float, ids long, labels float)"""
    test: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def prepare(path: str, label: str, positive: str, negative: str = "", categorical=(), continuous=(), drop=(),
            test_fraction: float = 0.2, max_vocab: int = 100_000, crosses=(), seed: int = 0) -> Prepared:
    p = Path(path)
    if not p.is_file():
        raise TabularError([f"data.path={path}: no such file (relative paths start at {Path.cwd()}). "
                            f"Give a CSV, .csv.gz or Parquet file."])
    header, rows = _read(p)
    if not header or not rows:
        raise TabularError([f"data.path={path}: the file has no data rows. Give a file with a header line and rows."])
    problems = []
    width = len(header)
    bad = next((i for i, r in enumerate(rows) if len(r) != width), None)
    if bad is not None:
        problems.append(f"data.path={path}: line {bad + 2} has {len(rows[bad])} fields, the header has {width}.")
    named = [("data.label", [label]), ("data.categorical", categorical), ("data.continuous", continuous),
             ("data.drop", drop), ("data.crosses", [c for pair in crosses for c in pair])]
    for key, cols in named:
        for c in cols:
            if c not in header:
                problems.append(f"{key}: column {c!r} is not in {path}. Its columns: {', '.join(header)}.")
    if not 0 < test_fraction < 1:
        problems.append(f"data.test_fraction={test_fraction} must be between 0 and 1 (e.g. 0.2).")
    if max_vocab < 2:
        problems.append(f"data.max_vocab={max_vocab} must be >= 2.")
    if problems:
        raise TabularError(problems)
    col = {h: i for i, h in enumerate(header)}
    labels_raw = [r[col[label]] for r in rows]
    values = sorted(set(labels_raw))
    if str(positive) not in values:
        raise TabularError([f"data.positive={positive}: no row of column {label!r} has that value; its values: "
                            f"{', '.join(values[:10])}. Set data.positive to the clicked/positive one."])
    negatives = {negative} if negative else set(values) - {str(positive)}
    if not negative and len(negatives) != 1:
        raise TabularError([f"data.label={label}: has {len(values)} values ({', '.join(values[:10])}); with "
                            f"data.positive={positive} the negative one is ambiguous. Set data.negative=<value>."])
    unknown = sorted(set(values) - negatives - {str(positive)})
    if unknown:
        raise TabularError([f"data.label={label}: values {', '.join(unknown[:10])} are neither data.positive="
                            f"{positive} nor data.negative={negative}. Fix the file or set data.negative."])
    features = [h for h in header if h != label and h not in drop]
    cont = [h for h in features if h in continuous or (h not in categorical and
            all(_is_number(r[col[h]]) for r in rows if r[col[h]] != ""))]
    cats = [h for h in features if h not in cont]
    if not cont and not cats and not crosses:
        raise TabularError([f"data.path={path}: no feature columns left after data.label and data.drop."])

    y = torch.tensor([1.0 if v == str(positive) else 0.0 for v in labels_raw])
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, int(round(len(rows) * test_fraction)))
    test_idx, train_idx = order[:n_test].tolist(), order[n_test:].tolist()
    if not train_idx:
        raise TabularError([f"data.path={path}: {len(rows)} rows leave nothing to train on with data.test_fraction="
                            f"{test_fraction}."])

    dense = torch.zeros(len(rows), len(cont))
    for j, h in enumerate(cont):
        raw = [r[col[h]] for r in rows]
        vals = [float(v) if v != "" and _is_number(v) else float("nan") for v in raw]
        t = torch.tensor(vals)
        train_vals = t[train_idx]
        ok = ~torch.isnan(train_vals)
        mean = train_vals[ok].mean() if ok.any() else torch.tensor(0.0)
        std = train_vals[ok].std() if ok.sum() > 1 else torch.tensor(1.0)
        t = torch.where(torch.isnan(t), mean, t)
        dense[:, j] = (t - mean) / (std if std > 0 else 1.0)

    cat_columns = [[r[col[h]] for r in rows] for h in cats]
    cat_columns += [[f"{r[col[a]]}|{r[col[b]]}" for r in rows] for a, b in crosses]
    sizes, ids = [], torch.zeros(len(rows), len(cat_columns), dtype=torch.long)
    for j, raw in enumerate(cat_columns):
        distinct = sorted({raw[i] for i in train_idx})
        if len(distinct) + 1 <= max_vocab:
            vocab = {v: k + 1 for k, v in enumerate(distinct)}  # 0 = out of vocabulary
            ids[:, j] = torch.tensor([vocab.get(v, 0) for v in raw])
            sizes.append(len(distinct) + 1)
        else:
            ids[:, j] = torch.tensor([_bucket(v, max_vocab) for v in raw])
            sizes.append(max_vocab)
    pick = lambda idx: (dense[idx], ids[idx], y[idx])  # noqa: E731
    names = cats + [f"{a}|{b}" for a, b in crosses]
    return Prepared(cont, names, sizes, pick(train_idx), pick(test_idx))
