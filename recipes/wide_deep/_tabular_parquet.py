"""Parquet files and Arrow columns as recipes/wide_deep's tabular readers take them: one file's batches for
``_tabular_read.read_batches`` (``parquet_batches``), and any Arrow column as codes into its distinct values as text
(``coded``) or as float64 (``floats``), for those batches and for the row groups of streamed data
(``_tabular_stream.py``). Imported only where pyarrow is (a Parquet file, or streamed data)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from launcher.recipes.wide_deep import _tabular_read
from launcher.recipes.wide_deep._tabular_read import CHUNK, INSTALL, Coded, ReadError, _unreadable


def parquet_file(path: Path):
    pa = _tabular_read._pyarrow()  # looked up at call time: tests take pyarrow away there
    if pa is None:
        raise ReadError(f"data.path={path}: reading Parquet needs pyarrow. Install it: {INSTALL}")
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ReadError(_unreadable(path, e)) from None


def parquet_batches(path: Path, f, text: set[str], skip: set[str]) -> Iterator:
    import pyarrow as pa

    schema = f.schema_arrow
    want = [h for h in dict.fromkeys(schema.names) if h not in skip]
    number = {h for h in want if h not in text and _is_number_type(schema.field(h).type)}
    try:
        for batch in f.iter_batches(batch_size=CHUNK, columns=want, use_threads=True):
            columns: dict = {}
            for h in want:  # str(value) of a batch's distinct values may repeat ("" for None and "")
                col = batch.column(h)
                if h in number:
                    columns[h] = floats(col)
                    continue
                columns[h] = coded(col, used_only=True)
            if batch.num_rows:
                yield batch.num_rows, columns
    except (pa.ArrowException, OSError) as e:
        raise ReadError(_unreadable(path, e)) from None


def coded(column, used_only: bool = False) -> Coded:
    """A pyarrow column (array or chunked) as int32 codes into its distinct values as text, None and "" as "". A
    dictionary-encoded column keeps its own dictionary (used_only: only the values its rows use, as a batch's
    dictionary must be for vocabularies and typing), any other is encoded here."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        dictionary = pa.types.is_dictionary(column.type)
        column = (column.unify_dictionaries() if dictionary else column).combine_chunks()
    if pa.types.is_dictionary(column.type) and used_only:
        column = column.dictionary_decode()
    if not pa.types.is_dictionary(column.type):
        try:
            column = pc.dictionary_encode(column, null_encoding="encode")
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a type the hash kernels do not take
            column = pc.dictionary_encode(_as_text(column))
    uniques, indices = _as_text(column.dictionary), column.indices
    if indices.null_count:  # a dictionary column's nulls: one more value, ""
        indices = indices.fill_null(len(uniques))
        uniques = pa.concat_arrays([uniques, pa.array([""], pa.string())])
    return Coded(indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), uniques)


def floats(column) -> np.ndarray:
    """A pyarrow number column (array or chunked, dictionary-encoded or not) as float64, NaN for a missing value."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return column.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def _as_text(column):
    """A pyarrow array as text: each value's str(), None as "" (text itself without a Python string each)."""
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.fill_null("").cast(pa.string())
    return pa.array(["" if v is None else str(v) for v in column.to_pylist()], pa.string())


def _is_number_type(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t)
