"""Reading a tabular file column by column, for recipes/wide_deep/tabular.py.

A column comes back dictionary-encoded (``Coded``: an int32 code per row into its distinct values as text, "" for
a missing value) or, for a Parquet number column that need not be text, as float64 (NaN = missing). No Python
object is made per cell: pyarrow's streaming CSV reader and Parquet batches are encoded batch by batch and the
dictionaries unified at the end. Without pyarrow, a CSV is read with Python's csv module in chunks of rows (the cells
of one chunk at a time), which is slower but no bigger; Parquet needs pyarrow.

Text is as the reader before this one saw it: a CSV is UTF-8 (a BOM dropped, bad bytes replaced), its separator
sniffed among , ; tab | from the first 64 KiB, each cell stripped of whitespace, rows with only blank cells skipped;
a Parquet value is str(value), None as "".
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE = 65536
"""Bytes of (decompressed) text the dialect is sniffed from."""
CHUNK = 65536
"""Rows the csv-module reader holds as Python strings at a time; rows of a Parquet batch."""
BLOCK_BYTES = 1 << 20
"""Bytes of CSV text pyarrow parses at a time (bigger blocks: more read ahead, held at once)."""
INSTALL = "pip install pyarrow"


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


def read_table(path: Path, text: set[str], skip: set[str]) -> Table:
    """The columns of path other than skip (each in text comes back Coded). ReadError for a file that is not a
    table."""
    if is_parquet(path):
        return _read_parquet(path, text, skip)
    head = _head(path)
    dialect = _dialect(head)
    pa = _pyarrow()
    if pa is not None and "\ufffd" not in _text(head):
        try:
            return _read_csv_arrow(path, dialect, skip)
        except UnicodeError:  # bad bytes past the sample: the csv module replaces them, as it always did
            pass
    return _read_csv_python(path, dialect, skip)


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


def _dialect(head: bytes):
    sample = _text(head).removeprefix("\ufeff")
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        return csv.excel


def header(path: Path) -> list[str]:
    """The column names (stripped); [] for a file without a header line. ReadError for an unreadable file."""
    if is_parquet(path):
        return list(_parquet_file(path).schema_arrow.names)
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


def _read_csv_arrow(path: Path, dialect, skip: set[str]) -> Table:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    names = header(path)
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
    codes = {i: array("i") for i in keep}  # grown in place (realloc): no copy of a column, no heap of small chunks
    chunks: dict[int, list] = {i: [] for i in keep}  # (rows, dictionary) per batch
    rows, before_header = 0, True
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
                for i in keep:  # the codes as numpy at once: pyarrow's pool would keep what it held
                    col = trimmed[i] if i in trimmed else pc.utf8_trim_whitespace(batch.column(i))
                    col, mask = col.slice(start), None if keep_rows is None else keep_rows.slice(start)
                    encoded = (col if mask is None else col.filter(mask)).dictionary_encode()
                    codes[i].frombytes(_bytes(encoded.indices.to_numpy(zero_copy_only=False)))
                    chunks[i].append((len(encoded), encoded.dictionary))
                n = batch.num_rows - start
                rows += n if keep_rows is None else int(pc.sum(keep_rows.slice(start)).as_py() or 0)
    except pa.ArrowInvalid as e:
        if bad:
            raise ReadError(bad[0]) from None
        if "utf8" in str(e).lower().replace("-", ""):
            raise UnicodeError(str(e)) from None
        raise ReadError(_unreadable(path, e)) from None
    except (OSError, EOFError, zlib.error) as e:
        raise ReadError(_unreadable(path, e)) from None
    columns = {}
    for i in keep:  # each batch's dictionary holds only values its rows use: unified, each used, none twice
        columns[names[i]] = Coded(*_unified(codes.pop(i), chunks.pop(i)))
        pa.default_memory_pool().release_unused()  # what unifying a big dictionary took, back to the system
    return Table(names, rows, columns, "pyarrow")


def _unified(buffer: array, parts: list):
    """The codes of every batch one after the other in buffer, each batch's (rows, dictionary) in parts -> (int32
    codes of all rows into one sorted dictionary of distinct values, that dictionary); the codes are rewritten in
    buffer itself. Sorting the batches' dictionaries together finds the distinct values with a fraction of the
    memory of a hash table (pyarrow's unify_dictionaries took 150 bytes a value, 0.7 GB for 4.8 M ids)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = np.frombuffer(buffer, np.int32) if len(buffer) else np.zeros(0, np.int32)
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


def _read_csv_python(path: Path, dialect, skip: set[str]) -> Table:
    names: list[str] = []
    keep: list[int] = []
    codes: dict[int, array] = {}
    vocab: dict[int, dict[str, int]] = {}
    rows, chunk = 0, []

    def flush() -> None:
        for i in keep:
            d = vocab[i]
            column = np.fromiter((d.setdefault(r[i].strip(), len(d)) for r in chunk), np.int32, len(chunk))
            codes[i].frombytes(_bytes(column))
        chunk.clear()

    try:
        with _open(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="") as text:
            reader = csv.reader(text, dialect)
            for r in reader:
                if not r or not any(c.strip() for c in r):
                    continue
                if not names:
                    names = [h.strip() for h in r]
                    keep = [i for i, h in enumerate(names) if h not in skip]
                    codes, vocab = {i: array("i") for i in keep}, {i: {} for i in keep}
                    continue
                if len(r) != len(names):
                    raise ReadError(f"data.path={path}: line {reader.line_num} has {len(r)} fields, the header has "
                                    f"{len(names)}. Fix that line (a stray separator or quote?) or remove it.")
                chunk.append(r)
                rows += 1
                if len(chunk) == CHUNK:
                    flush()
            flush()
    except (csv.Error, OSError, EOFError, zlib.error) as e:
        raise ReadError(_unreadable(path, e)) from None
    columns = {}
    for i in keep:
        buffer = codes.pop(i)
        columns[names[i]] = Coded(np.frombuffer(buffer, np.int32) if len(buffer) else np.zeros(0, np.int32),
                                  list(vocab.pop(i)))
    return Table(names, rows, columns, "Python's csv module")


def _parquet_file(path: Path):
    pa = _pyarrow()
    if pa is None:
        raise ReadError(f"data.path={path}: reading Parquet needs pyarrow. Install it: {INSTALL}")
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ReadError(_unreadable(path, e)) from None


def _read_parquet(path: Path, text: set[str], skip: set[str]) -> Table:
    import pyarrow as pa

    f = _parquet_file(path)
    schema = f.schema_arrow
    names = list(schema.names)
    want = [h for h in dict.fromkeys(names) if h not in skip]
    number = {h for h in want if h not in text and _is_number_type(schema.field(h).type)}
    floats: dict[str, list] = {h: [] for h in want if h in number}
    codes = {h: array("i") for h in want if h not in number}
    parts: dict[str, list] = {h: [] for h in codes}  # (rows, dictionary as text) per batch
    try:
        for batch in f.iter_batches(batch_size=CHUNK, columns=want, use_threads=True):
            for h in want:
                col = batch.column(h)
                if h in number:
                    floats[h].append(col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False))
                    continue
                try:
                    encoded = col.dictionary_encode(null_encoding="encode")
                except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a type the hash kernels do not take
                    encoded = _as_text(col).dictionary_encode()
                codes[h].frombytes(_bytes(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)))
                parts[h].append((len(encoded), _as_text(encoded.dictionary)))
    except (pa.ArrowException, OSError) as e:
        raise ReadError(_unreadable(path, e)) from None
    columns = {}
    for h in want:  # str(value) of a batch's distinct values may repeat ("" for None and ""): _unified merges them
        columns[h] = (np.concatenate(floats.pop(h)) if floats[h] else np.zeros(0)) if h in number else \
            Coded(*_unified(codes.pop(h), parts.pop(h)))
    return Table(names, f.metadata.num_rows, columns, "pyarrow")


def _as_text(column):
    """A pyarrow array as text: each value's str(), None as "" (text itself without a Python string each)."""
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.fill_null("").cast(pa.string())
    return pa.array(["" if v is None else str(v) for v in column.to_pylist()], pa.string())


def _is_number_type(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t)


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
