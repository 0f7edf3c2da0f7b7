"""Reading a tabular file column by column, for recipes/wide_deep/tabular.py.

The file comes in batches of rows (``read_batches``: pyarrow's streaming CSV reader, 1 MiB of text at a time, or
Parquet batches; without pyarrow, Python's csv module CHUNK rows at a time: slower, no bigger; Parquet needs
pyarrow). In a batch a column is dictionary-encoded (``Coded``: an int32 code per row into the batch's distinct
values as text, "" for a missing value) or, for a Parquet number column that need not be text, float64 (NaN =
missing); no Python object per cell. ``read_table`` unifies the batches' dictionaries into one per column
(vocabularies); data.hash_buckets folds each batch as it comes and keeps no dictionary beyond the batch.

Text is as the reader before this one saw it: a CSV is UTF-8 (a BOM dropped, bad bytes replaced), its separator
sniffed among , ; tab | from the first 64 KiB, each cell stripped of whitespace, rows with only blank cells skipped;
a Parquet value is str(value), None as "".
"""

from __future__ import annotations

import codecs
import csv
import functools
import glob
import gzip
import io
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

SAMPLE = 65536
"""Bytes of (decompressed) text the dialect is sniffed from."""
CHUNK = 65536
"""Rows the csv-module reader holds as Python strings at a time; rows of a Parquet batch."""
BLOCK_BYTES = 1 << 20
"""Bytes of CSV text pyarrow parses at a time (bigger blocks: more read ahead, held at once)."""
INSTALL = "pip install pyarrow"
T = TypeVar("T")


class ReadError(ValueError):
    """The file cannot be read as a table; ``problem`` names it and says what to give instead."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


@dataclass
class Coded:
    codes: np.ndarray
    """int32, one per row: the index of its value in uniques."""
    uniques: object
    """The distinct values as text (a list of str, or a pyarrow string array); every one is some row's value."""

    def __len__(self) -> int:
        return len(self.uniques)

    def texts(self, start: int = 0, stop: int | None = None) -> list[str]:
        part = self.uniques[start:stop]
        return part if isinstance(part, list) else part.to_pylist()


@dataclass
class Table:
    header: list[str]
    rows: int
    columns: dict
    """name -> Coded, or a float64 array (NaN = missing) for a Parquet number column."""
    reader: str
    """What read it: "pyarrow" or "Python's csv module"."""


def _pyarrow():
    """pyarrow, or None where it is not installed."""
    try:
        import pyarrow as pa
    except ImportError:
        return None
    return pa


def is_parquet(path: Path) -> bool:
    return path.name.lower().endswith((".parquet", ".pq"))


def is_streamed(path: str) -> bool:
    """data.path names a directory or a glob (streamed by row group: _tabular_stream.py) rather than one file (a file
    whose name holds * ? [ is that file)."""
    return Path(str(path)).is_dir() or (glob.has_magic(str(path)) and not Path(str(path)).is_file())


def read_batches(path: Path, text: set[str], skip: set[str], fold: Callable[[list[str], str, Iterator], T]) -> T:
    """fold(header, reader, batches) over the batches of path: each batch is (rows, {column: Coded or float64 array})
    with every column but skip (each in text Coded), the reader "pyarrow" or "Python's csv module". ReadError for a
    file that is not a table. A CSV with bad UTF-8 past the sampled head is folded again from its start by the csv
    module (which replaces bad bytes), so fold must keep no state between calls."""
    if is_parquet(path):
        from launcher.recipes.wide_deep._tabular_parquet import parquet_batches, parquet_file

        f = parquet_file(path)
        return fold(list(f.schema_arrow.names), "pyarrow", parquet_batches(path, f, text, skip))
    head = _head(path)
    dialect = _dialect(head)
    pa = _pyarrow()
    if pa is not None and "\ufffd" not in _text(head):
        try:
            names = header(path)
            return fold(names, "pyarrow", _csv_arrow_batches(path, dialect, skip, names))
        except UnicodeError:  # bad bytes past the sample: the csv module replaces them, as it always did
            pass
    batches = _csv_python_batches(path, dialect, skip)
    return fold(next(batches), "Python's csv module", batches)  # its first item: the header it found


def read_table(path: Path, text: set[str], skip: set[str]) -> Table:
    """The columns of path other than skip (each in text comes back Coded), every batch's dictionaries unified.
    ReadError for a file that is not a table."""
    return read_batches(path, text, skip, _gathered)


def _gathered(names: list[str], reader: str, batches: Iterator) -> Table:
    codes: dict[str, array] = {}  # grown in place (realloc): no copy of a column, no heap of small chunks
    parts: dict[str, list] = {}  # (rows, dictionary) per batch
    floats: dict[str, list] = {}
    rows = 0
    for n, cols in batches:
        rows += n
        for h, col in cols.items():
            if isinstance(col, np.ndarray):
                floats.setdefault(h, []).append(col)
            else:
                codes.setdefault(h, array("i")).frombytes(_bytes(col.codes))
                parts.setdefault(h, []).append((n, col.uniques))
    columns: dict = {h: np.concatenate(floats.pop(h)) for h in list(floats)}
    for h in list(codes):  # each batch's dictionary holds only values its rows use: unified, each used, none twice
        columns[h] = Coded(*_unified(codes.pop(h), parts.pop(h)))
        if reader == "pyarrow":
            _pyarrow().default_memory_pool().release_unused()  # what unifying a big dictionary took, back to the OS
    return Table(names, rows, columns, reader)


def _open(path: Path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _head(path: Path) -> bytes:
    """The first SAMPLE bytes of a CSV's text; ReadError for a file that holds no text."""
    try:
        with _open(path) as f:
            head = f.read(SAMPLE)
    except (OSError, EOFError, zlib.error) as e:
        raise ReadError(_unreadable(path, e)) from None
    if head[:4] == b"PAR1":
        raise ReadError(f"data.path={path}: is a Parquet file named as a CSV. Rename it to end in .parquet.")
    if b"\0" in head or _text(head).count("\ufffd") > len(head) // 100:
        raise ReadError(f"data.path={path}: holds binary bytes, not CSV text. Give a UTF-8 CSV file with a header "
                        f"line (.csv, or gzip'd .csv.gz) or a Parquet file (.parquet).")
    return head


def _text(head: bytes) -> str:
    """head decoded, bad bytes replaced (a character cut at the end of the sample is left out)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)


def _unreadable(path: Path, e: BaseException) -> str:
    what = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
    if is_parquet(path):
        return (f"data.path={path}: cannot be read as Parquet ({what[:200]}): cut short or not Parquet. Write the "
                f"file again whole (e.g. pandas' DataFrame.to_parquet), or give a CSV file.")
    return (f"data.path={path}: cannot be read as a table ({what[:200]}). Give a whole UTF-8 CSV file with a header "
            f"line (.csv, or gzip'd .csv.gz) or a Parquet file (.parquet).")


@functools.lru_cache(maxsize=2)
def _dialect(head: bytes):
    """The CSV dialect sniffed from head (the same head asked again, as each pass asks it three times: cached, since
    csv.Sniffer takes up to a second on 64 KiB)."""
    sample = _text(head).removeprefix("\ufeff")
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        return csv.excel


def header(path: Path) -> list[str]:
    """The column names (stripped); [] for a file without a header line. ReadError for an unreadable file."""
    if is_parquet(path):
        from launcher.recipes.wide_deep._tabular_parquet import parquet_file

        return list(parquet_file(path).schema_arrow.names)
    head = _head(path)
    reader = csv.reader(io.StringIO(_text(head).removeprefix("\ufeff")), _dialect(head))
    try:
        for row in reader:
            if row and any(c.strip() for c in row):
                return [h.strip() for h in row]
    except csv.Error as e:
        raise ReadError(_unreadable(path, e)) from None
    return []


def _blank(row_text: str, delimiter: str, quote: str | None) -> bool:
    for ch in (delimiter, quote or ""):
        row_text = row_text.replace(ch, "") if ch else row_text
    return not row_text.strip()


def _csv_arrow_batches(path: Path, dialect, skip: set[str], names: list[str]) -> Iterator:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    width = len(names)
    bad: list[str] = []

    def invalid(row) -> str:
        if _blank(row.text, dialect.delimiter, dialect.quotechar):
            return "skip"
        bad.append(f"data.path={path}: a row has {row.actual_columns} fields, the header has {row.expected_columns}: "
                   f"{row.text[:120]!r}. Fix that row (a stray separator or quote?) or remove it.")
        return "error"

    keys = [f"c{i}" for i in range(width)]  # by position: a header may repeat a name or leave one empty
    read = pcsv.ReadOptions(column_names=keys, block_size=BLOCK_BYTES)
    parse = pcsv.ParseOptions(delimiter=dialect.delimiter, quote_char=dialect.quotechar or False,
                              double_quote=dialect.doublequote, escape_char=dialect.escapechar or False,
                              newlines_in_values=True, invalid_row_handler=invalid)
    convert = pcsv.ConvertOptions(column_types={k: pa.string() for k in keys}, strings_can_be_null=False,
                                  quoted_strings_can_be_null=False, null_values=[])
    keep = [i for i, h in enumerate(names) if h not in skip]
    before_header = True
    try:
        with _open(path) as raw, pa.PythonFile(raw, mode="r") as source:
            for batch in pcsv.open_csv(source, read_options=read, parse_options=parse, convert_options=convert):
                trimmed, blank = {}, None
                for i in range(width):  # rows of blank cells are skipped; in most batches none is
                    if blank is not None and not pc.any(blank).as_py():
                        break
                    trimmed[i] = pc.utf8_trim_whitespace(batch.column(i))
                    empty = pc.equal(pc.binary_length(trimmed[i]), 0)
                    blank = empty if blank is None else pc.and_(blank, empty)
                keep_rows = None if blank is None or not pc.any(blank).as_py() else pc.invert(blank)
                start = 0
                if before_header:  # the header line came as the first row that is not blank
                    filled = [0] if keep_rows is None else np.flatnonzero(keep_rows.to_numpy(zero_copy_only=False))
                    if not len(filled):
                        continue
                    start, before_header = 1 + int(filled[0]), False
                columns = {}
                for i in keep:  # the codes as numpy at once: pyarrow's pool would keep what it held
                    col = trimmed[i] if i in trimmed else pc.utf8_trim_whitespace(batch.column(i))
                    col, mask = col.slice(start), None if keep_rows is None else keep_rows.slice(start)
                    encoded = (col if mask is None else col.filter(mask)).dictionary_encode()
                    columns[names[i]] = Coded(encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary)
                n = batch.num_rows - start
                n = n if keep_rows is None else int(pc.sum(keep_rows.slice(start)).as_py() or 0)
                if n:
                    yield n, columns
    except pa.ArrowInvalid as e:
        if bad:
            raise ReadError(bad[0]) from None
        if "utf8" in str(e).lower().replace("-", ""):
            raise UnicodeError(str(e)) from None
        raise ReadError(_unreadable(path, e)) from None
    except (OSError, EOFError, zlib.error) as e:
        raise ReadError(_unreadable(path, e)) from None


def _unified(buffer: array, parts: list):
    """The codes of every batch one after the other in buffer, each batch's (rows, dictionary) in parts -> (int32
    codes of all rows into one dictionary of distinct values, that dictionary); the codes are rewritten in buffer
    itself. pyarrow dictionaries are sorted together: that finds the distinct values with a fraction of the memory
    of a hash table (pyarrow's unify_dictionaries took 150 bytes a value, 0.7 GB for 4.8 M ids). The csv module's
    lists of text are merged in a dict, in the order values first appear."""
    codes = np.frombuffer(buffer, np.int32) if len(buffer) else np.zeros(0, np.int32)
    if parts and isinstance(parts[0][1], list):
        index: dict[str, int] = {}
        at = 0
        for n, d in parts:
            lut = np.fromiter((index.setdefault(v, len(index)) for v in d), np.int32, len(d))
            np.take(lut, codes[at : at + n], out=codes[at : at + n], mode="clip")  # in place: clip needs no buffer
            at += n
        parts.clear()
        return codes, list(index)
    import pyarrow as pa
    import pyarrow.compute as pc

    if not parts:
        return codes, pa.array([], pa.string())
    values = pa.chunked_array([d for _, d in parts], type=parts[0][1].type).combine_chunks()
    order = pc.sort_indices(values)
    ranked = values.take(order)
    del values
    first = np.ones(len(ranked), bool)  # the first of each run of equal values
    if len(ranked) > 1:
        first[1:] = pc.not_equal(ranked.slice(1), ranked.slice(0, len(ranked) - 1)).to_numpy(zero_copy_only=False)
    to_global = np.empty(len(ranked), np.int32)
    to_global[order.to_numpy()] = np.cumsum(first, dtype=np.int64) - 1
    del order
    dictionary = ranked.filter(pa.array(first))
    at = entry = 0
    for n, d in parts:  # each batch's codes index its own dictionary, whose entries start at entry in to_global
        np.take(to_global[entry : entry + len(d)], codes[at : at + n], out=codes[at : at + n], mode="clip")
        at, entry = at + n, entry + len(d)
    parts.clear()
    return codes, dictionary


def _csv_python_batches(path: Path, dialect, skip: set[str]) -> Iterator:
    """First the header ([] for a file without one), then batches of CHUNK rows, each column's text in a dict."""
    names: list[str] = []
    keep: list[int] = []
    chunk: list[list[str]] = []

    def batch() -> tuple[int, dict]:
        columns = {}
        for i in keep:
            d: dict[str, int] = {}
            codes = np.fromiter((d.setdefault(r[i].strip(), len(d)) for r in chunk), np.int32, len(chunk))
            columns[names[i]] = Coded(codes, list(d))
        n = len(chunk)
        chunk.clear()
        return n, columns

    try:
        with _open(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="") as text:
            reader = csv.reader(text, dialect)
            for r in reader:
                if not r or not any(c.strip() for c in r):
                    continue
                if not names:
                    names = [h.strip() for h in r]
                    keep = [i for i, h in enumerate(names) if h not in skip]
                    yield names
                    continue
                if len(r) != len(names):
                    raise ReadError(f"data.path={path}: line {reader.line_num} has {len(r)} fields, the header has "
                                    f"{len(names)}. Fix that line (a stray separator or quote?) or remove it.")
                chunk.append(r)
                if len(chunk) == CHUNK:
                    yield batch()
            if not names:
                yield names
            elif chunk:
                yield batch()
    except (csv.Error, OSError, EOFError, zlib.error) as e:
        raise ReadError(_unreadable(path, e)) from None


def compact(codes: np.ndarray, uniques: list[str]) -> Coded:
    """codes into uniques that may repeat a value or hold unused ones -> the same rows (rewritten in place) into
    distinct used values."""
    used = np.bincount(codes, minlength=len(uniques)) > 0 if len(codes) else np.zeros(len(uniques), bool)
    index: dict[str, int] = {}
    lut = np.array([index.setdefault(v, len(index)) if u else -1 for v, u in zip(uniques, used)], np.int32)
    if len(codes):
        np.take(lut, codes, out=codes, mode="clip")  # in place: clip, unlike raise, needs no buffer
    return Coded(codes, list(index))


def _bytes(a: np.ndarray) -> memoryview:
    """A numpy array's memory as bytes, for array.frombytes (which takes no numpy array itself)."""
    return memoryview(np.ascontiguousarray(a)).cast("B")
