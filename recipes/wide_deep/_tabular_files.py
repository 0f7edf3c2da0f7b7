"""Streamed data=tabular, the files' side: which Parquet files ``data.path`` (a directory or a glob) names, their
row groups from the footers, the train / eval split by row group, the columns' types from the schema, the label
values from a sample. Read only metadata and one column of one row group: the launcher calls ``layout`` for the
facts (``stream_facts``), every rank calls it again (the same files, the same answer) before it streams.

Files: a directory's files at any depth, sorted by path, hidden ones (``.x``, ``_x``: ``_SUCCESS``, ``_metadata``)
left out; a glob's matches (``**`` at any depth), sorted. Only Parquet (``.parquet``, ``.pq``): a CSV has no row
groups and no row counts before it is read whole, so it is refused with the conversion. Every file must hold the
first file's columns, each with the same type (a dictionary-encoded column counts as its values' type).

Types come from the schema, not from the values (which the launcher never reads): data.continuous, then
data.categorical, then a Parquet number column is continuous, any other column categorical. Categorical columns are
hashed (data.hash_buckets > 0): a vocabulary needs a pass over every row, which data larger than memory never has.

Eval: ``data.eval_path`` (files of the same schema), else ``data.test_fraction`` of the row groups (at least one),
chosen with data.seed; the rest train. The label's values are checked on the first train row group's label column
and on every row group's min / max in the footers; a rank meeting another value stops naming it. A continuous column
whose footer min / max is inf, -inf or beyond float32 is refused (``_not_finite``).
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from launcher.recipes.wide_deep._tabular_columns import not_finite
from launcher.recipes.wide_deep._tabular_parquet import _is_number_type, coded
from launcher.recipes.wide_deep._tabular_read import INSTALL, _pyarrow, _unreadable
from launcher.recipes.wide_deep.tabular import (TabularError, _check_labels, _hash_problems, _key_problems,
                                                id_columns)

SUFFIXES = (".parquet", ".pq")
TEST_FRACTION = 0.2
"""data.test_fraction's default; with data.eval_path another value is refused (it would do nothing)."""
CSV = (".csv", ".csv.gz", ".tsv")
CONVERT = ("pyarrow.parquet.write_table(pyarrow.csv.read_csv(f), f.replace('.csv', '.parquet'), "
           "row_group_size=250_000)")


@dataclass(frozen=True)
class Layout:
    """What both the launcher and the ranks know of streamed files before reading a row: all from footers, but for
    the label values (one column of one row group)."""

    path: str
    files: tuple[str, ...]
    """data.path's files, then data.eval_path's."""
    train: np.ndarray
    """int64 (file, row group, rows) per training row group, in file order."""
    eval: np.ndarray
    """The same for the held-out row groups."""
    continuous: tuple[str, ...]
    categorical: tuple[str, ...]
    crosses: tuple[tuple[str, str], ...]
    label: str
    positive: str
    negative: str
    """The negative label value (data.negative, or the one other value seen)."""
    text: tuple[str, ...]
    """The columns read as text (Parquet dictionaries kept): string or binary ones among those read."""
    group_bytes: int
    """Uncompressed bytes of the biggest row group (what reading one takes)."""
    sample: tuple[int, float]
    """(rows, positive share) of the first train row group."""
    held_out: str
    """How eval was chosen, for the data line."""

    @property
    def fields(self) -> list[str]:
        return [*self.categorical, *(f"{a}|{b}" for a, b in self.crosses)]

    @property
    def columns(self) -> list[str]:
        """The columns a row group is read with."""
        return list(dict.fromkeys([self.label, *self.continuous, *self.categorical,
                                   *(c for pair in self.crosses for c in pair)]))

    @property
    def group_rows(self) -> int:
        return int(max(self.train[:, 2].max(), self.eval[:, 2].max() if len(self.eval) else 0))


def discover(path: str, key: str) -> list[str]:
    """The Parquet files ``key``=path names (a directory or a glob), sorted; TabularError naming what is wrong."""
    if glob.has_magic(path):
        found = sorted(p for p in glob.glob(path, recursive=True) if Path(p).is_file())
        if not found:
            raise TabularError([f"{key}={path}: the glob matches no file (relative paths start at {Path.cwd()}). "
                                f"Give a directory or a glob of Parquet files, e.g. {key}=/data/clicks/*.parquet."])
    else:
        root = Path(path)
        found = sorted(str(p) for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
        if not found:
            raise TabularError([f"{key}={path}: the directory holds no file. Give a directory of Parquet files "
                                f"(.parquet), e.g. written by pandas' DataFrame.to_parquet or Spark."])
    csv = [f for f in found if f.lower().endswith(CSV)]
    if csv:
        raise TabularError([f"{key}={path}: {csv[0]} is a CSV file ({len(csv)} of {len(found)}); streamed data "
                            f"(a directory or glob) is read by Parquet row group, whose row counts are in the "
                            f"footer. Convert each file, e.g. {CONVERT}, or give one CSV file as {key}."])
    other = [f for f in found if not f.lower().endswith(SUFFIXES)]
    if other:
        raise TabularError([f"{key}={path}: {other[0]} is not a Parquet file ({len(other)} of {len(found)} are not: "
                            f"names ending in .parquet or .pq are). Move them out, or give a glob, e.g. "
                            f"{key}={path.rstrip('/')}/*.parquet."])
    return found


def _hidden(rel: Path) -> bool:
    return any(part.startswith((".", "_")) for part in rel.parts)


def _footers(files: list[str]) -> list:
    """(arrow schema, Parquet metadata) of each file; TabularError for one that cannot be read."""
    pa = _pyarrow()
    if pa is None:
        raise TabularError([f"data.path: reading Parquet needs pyarrow. Install it: {INSTALL}"])
    import pyarrow.parquet as pq

    out = []
    for f in files:
        try:
            meta = pq.read_metadata(f)
            out.append((meta.schema.to_arrow_schema(), meta))
        except (pa.ArrowException, OSError) as e:
            raise TabularError([_unreadable(Path(f), e)]) from None
    return out


def _plain(t):
    """A column's type as the values read: a dictionary's value type, large types as their small twins."""
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    return pa.string() if pa.types.is_large_string(t) else pa.binary() if pa.types.is_large_binary(t) else t


def _schema_problems(footers: list, files: list[str], used: list[str]) -> list[str]:
    """Each file against the first: a column it lacks or types otherwise (only columns this run reads)."""
    first = footers[0][0]
    for (schema, _), f in zip(footers[1:], files[1:]):
        missing = [h for h in used if schema.get_field_index(h) < 0]
        if missing:
            return [f"data.path: {f} has another schema than {files[0]}: it lacks column(s) "
                    f"{', '.join(missing[:5])}. Give files of one schema (move the other files out, or name them "
                    f"with a glob)."]
        for h in used:
            a, b = _plain(first.field(h).type), _plain(schema.field(h).type)
            if a != b:
                return [f"data.path: {f} has another schema than {files[0]}: column {h!r} is {b} there and {a} in "
                        f"the first file. Give files of one schema (write that column as {a})."]
    return []


def _units(footers: list, first: int = 0) -> np.ndarray:
    rows = [(first + i, g, m.row_group(g).num_rows) for i, (_, m) in enumerate(footers)
            for g in range(m.num_row_groups) if m.row_group(g).num_rows > 0]
    return np.array(rows, np.int64).reshape(-1, 3)


def _split(path: str, units: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, eval) row groups: a seeded choice of round(test_fraction × groups) (at least 1) held out."""
    n_eval = max(1, int(round(len(units) * test_fraction)))
    if n_eval >= len(units):
        raise TabularError([f"data.path={path}: {len(units)} row group(s) leave nothing to train on with "
                            f"data.test_fraction={test_fraction} (streamed data holds out whole row groups). Give "
                            f"held-out files as data.eval_path, or write the files with more, smaller row groups "
                            f"(pyarrow.parquet.write_table(..., row_group_size=250_000))."])
    held = np.zeros(len(units), bool)
    held[np.random.default_rng(seed % 2**64).permutation(len(units))[:n_eval]] = True
    return units[~held], units[held]


def layout(path: str, label: str, positive: str, negative: str = "", categorical=(), continuous=(), drop=(),
           test_fraction: float = TEST_FRACTION, max_vocab: int | None = None, crosses=(), seed: int = 0,
           hash_buckets: int = 0, eval_path: str = "") -> Layout:
    """The Layout of data.path's files (and data.eval_path's); TabularError with every problem found."""
    from launcher.recipes.wide_deep.tabular import MAX_VOCAB

    problems = _hash_problems(hash_buckets, MAX_VOCAB if max_vocab is None else max_vocab)
    if eval_path and test_fraction != TEST_FRACTION:
        problems.append(f"data.test_fraction={test_fraction} does nothing with data.eval_path={eval_path}: the "
                        f"eval files are held out and every row group of data.path trains. Remove one of them.")
    files = discover(str(path), "data.path")
    extra = discover(str(eval_path), "data.eval_path") if eval_path else []
    footers = _footers(files + extra)
    schema = footers[0][0]
    names = list(schema.names)
    crosses = [tuple(c) for c in crosses]
    problems += _key_problems(f"{files[0]} (the first of {len(files)} file(s))", names, label, categorical,
                              continuous, drop, crosses, test_fraction, MAX_VOCAB if max_vocab is None else max_vocab)
    if problems:
        raise TabularError(problems)
    features = [h for h in names if h != label and h not in drop]
    categorical = [*categorical, *id_columns(names, label, categorical, continuous, drop)]  # ids by name
    cont = [h for h in features if h in continuous or (h not in categorical and _is_number_type(
        _plain(schema.field(h).type)))]
    cats = [h for h in features if h not in cont]
    used = list(dict.fromkeys([label, *features, *(c for pair in crosses for c in pair)]))
    problems = _schema_problems(footers, files + extra, used)
    if not cont and not cats and not crosses:
        problems.append(f"data.path={path}: no feature columns left after data.label and data.drop.")
    if (cats or crosses) and not hash_buckets:
        problems.append(f"data.hash_buckets=0 builds vocabularies from a pass over every row of data.path, which "
                        f"streamed data (a directory or glob, read row group by row group) never makes. Set "
                        f"data.hash_buckets=1000000 (rows per categorical field: each value hashed as it is read), "
                        f"or give one file as data.path to build vocabularies.")
    if problems:
        raise TabularError(problems)
    return _layout(str(path), files + extra, footers, len(files), label, str(positive), str(negative), cont, cats,
                   crosses, test_fraction, seed, eval_path)


def _layout(path, files, footers, n_train_files, label, positive, negative, cont, cats, crosses, test_fraction, seed,
            eval_path) -> Layout:
    units = _units(footers[:n_train_files])
    if not len(units):
        raise TabularError([f"data.path={path}: the files have no data rows. Give Parquet files with rows."])
    if eval_path:
        train, held = units, _units(footers[n_train_files:], n_train_files)
        if not len(held):
            raise TabularError([f"data.eval_path={eval_path}: the files have no data rows. Give Parquet files with "
                                f"rows, or remove data.eval_path to hold out data.test_fraction of the row groups."])
        how = f"data.eval_path {eval_path}"
    else:
        train, held = _split(path, units, test_fraction, seed)
        how = f"data.test_fraction={test_fraction} of the row groups"
    schema = footers[0][0]
    reads = [label, *cont, *cats, *(c for pair in crosses for c in pair)]
    text = tuple(h for h in dict.fromkeys(reads) if _is_text(_plain(schema.field(h).type)))
    positive, negative, sample = _labels(files, footers, train, label, positive, negative)
    problems = _not_finite(path, files, footers, cont)
    if problems:
        raise TabularError(problems)
    group_bytes = max(m.row_group(g).total_byte_size for _, m in footers for g in range(m.num_row_groups))
    return Layout(path, tuple(files), train, held, tuple(cont), tuple(cats), tuple(crosses), label, positive, negative,
                  text, int(group_bytes), sample, how)


def _is_text(t) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_binary(t)


def _labels(files, footers, train: np.ndarray, label: str, positive: str,
            negative: str) -> tuple[str, str, tuple]:
    """(the positive and the negative label value, (rows, positive share) of the first train row group): the label
    values of that
    row group and every row group's footer min / max checked as one file's label column is."""
    import pyarrow.parquet as pq

    f, g, _ = (int(x) for x in train[0])
    col = coded(pq.ParquetFile(files[f]).read_row_group(g, columns=[label]).column(label), used_only=True)
    texts = col.texts()
    values = set(texts)
    missing = []
    for path, (_, meta) in zip(files, footers):
        index = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == label)
        for k in range(meta.num_row_groups):
            stats = meta.row_group(k).column(index).statistics
            if stats is not None and stats.has_min_max:
                values.update(_stat_text(v) for v in (stats.min, stats.max))
            if stats is not None and stats.has_null_count and stats.null_count:
                missing.append(f"{stats.null_count:,} in row group {k} of {path}")
    if missing:
        more = f" and {len(missing) - 3} more row groups" if len(missing) > 3 else ""
        raise TabularError([f"data.label={label}: rows without a label (null), by the files' footers: "
                            f"{'; '.join(missing[:3])}{more}. "
                            f"A row needs its label to train or to be scored: drop those rows or fill their label, or "
                            f"move the files out of data.path."])
    try:
        positive = _check_labels(label, positive, negative, sorted(values))
    except TabularError as e:
        raise TabularError([f"{e.problems[0]} (streamed data: the values of row group {g} of {files[f]} and the "
                            f"footers' min / max)"]) from None
    share = float(np.mean(np.array([t == positive for t in texts])[col.codes])) if len(col.codes) else 0.0
    return positive, negative or next(v for v in sorted(values) if v != positive), (len(col.codes), share)


def _not_finite(path: str, files, footers, cont) -> list[str]:
    """Continuous columns whose footer min / max, in any row group, is inf, -inf or beyond float32 (see
    ``_tabular_columns.Finite``: standardised, such a column is NaN and the run diverges at step 1). A rank refuses what
    footers without min / max hide, when it reads it."""
    seen: dict[str, list[str]] = {}
    for f, (_, meta) in zip(files, footers):
        index = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
        for h in cont:
            for k in range(meta.num_row_groups):
                stats = meta.row_group(k).column(index[h]).statistics
                ends = (stats.min, stats.max) if stats is not None and stats.has_min_max else ()
                if any(isinstance(v, float) and not_finite(np.array([v])).any() for v in ends):
                    seen.setdefault(h, []).append(f"row group {k} of {f} (min {ends[0]!r}, max {ends[1]!r})")
    return [f"data.path={path}: continuous column {h!r} holds values that are not finite numbers (inf, -inf, or beyond "
            f"float32's +-3.4e38) in {len(where):,} row group(s) by the footers' min / max, the first {where[0]}; "
            f"standardised, the column would be NaN and training would diverge at step 1. Clean the column (a null is "
            f"a missing value: the train mean), or set data.categorical=[{h}] to hash its values as categories, or "
            f"data.drop=[{h}]." for h, where in seen.items()]


def _stat_text(v) -> str:
    """A footer's min / max as the text str(value) of a read value would be."""
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def buffer_bytes(layout: Layout, shuffle_rows: int, prefetch: int) -> int:
    """What a rank's stream holds at most, in bytes: prefetch + 3 windows of shuffled rows (float32 per continuous
    column, int64 ids, a float32 label: the one being built, those queued, the one trained on and the one before it,
    which the last micro-batch handed out still views) with the permutation, one row group decoded (int32 ids) and
    one as read (8 bytes per value, the column chunks' bytes pre-buffered and for dictionaries)."""
    decoded = 4 * (len(layout.continuous) + len(layout.fields)) + 4
    shuffled = decoded + 4 * len(layout.fields) + 16
    window = shuffle_rows or layout.group_rows
    read = layout.group_rows * 8 * len(layout.columns) + 2 * layout.group_bytes
    return (prefetch + 3) * window * shuffled + layout.group_rows * decoded + read


def stream_facts(data) -> tuple[Layout, list[str], int]:
    """(the Layout of a streamed data config, the lines for the plan, what a rank's stream holds in bytes); raises
    TabularError. Reads footers and one row group's label column: never the data."""
    for key in ("shuffle_rows", "prefetch"):
        if getattr(data, key) < 0:
            raise TabularError([f"data.{key}={getattr(data, key)} must be >= 0 (0: {_ZERO[key]})."])
    lay = layout(data.path, data.label, str(data.positive), str(data.negative), list(data.categorical),
                 list(data.continuous), list(data.drop), data.test_fraction, data.max_vocab,
                 [list(c) for c in data.crosses], data.seed, data.hash_buckets, data.eval_path)
    train, held = int(lay.train[:, 2].sum()), int(lay.eval[:, 2].sum())
    held_files = len({int(f) for f in lay.eval[:, 0]})
    rows, share = lay.sample
    held_bytes = buffer_bytes(lay, data.shuffle_rows, data.prefetch)
    lines = [f"data: {data.path}: {len(lay.files)} Parquet file(s) streamed by row group: {train:,} train rows in "
             f"{len(lay.train)} row groups, {held:,} eval rows in {len(lay.eval)} ({held_files} file(s); "
             f"{lay.held_out}); {share:.1%} positive in the first train row group ({rows:,} rows); continuous "
             f"{list(lay.continuous) or '-'}; categorical {lay.fields} hashed into {data.hash_buckets:,} rows each "
             f"(row 0: a missing value)",
             f"data: each rank reads only the row groups of its part of each epoch, about {held_bytes / 2**20:,.0f} "
             f"MiB of them at a time (data.prefetch={data.prefetch} window(s) ahead, windows of "
             f"{data.shuffle_rows or lay.group_rows:,} rows shuffled); hash collisions are not counted (the "
             f"launcher reads the footers only)"]
    return lay, lines, held_bytes


_ZERO = {"shuffle_rows": "the biggest row group's rows", "prefetch": "read on the training thread"}
