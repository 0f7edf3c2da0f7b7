"""Streamed data=tabular, the rank's side: each data-parallel rank reads only the row groups of its own part of each
epoch, a window of rows at a time, and the position in the stream follows from the footers' row counts alone.

Epoch e of the N train rows (``_tabular_files.Layout.train``): the row groups in a seeded order (trainer.seed, e),
their rows one after the other. With micro-batches of m rows on dp ranks, an epoch has P = N // (m × dp) micro-batches
per rank and rank r owns rows [r × S, (r + 1) × S) of it, S = P × m: every rank the same number of steps, each row
used once, the last N − dp × S rows (fewer than one global micro-batch) left out of that epoch (DistributedSampler's
drop_last; the next epoch's order differs). A rank reads the row groups its rows lie in and no other, whole ones but
at the two ends of its part, where it reads the row group it shares with its neighbour and keeps only its own rows.
Its part is cut into windows of W rows (data.shuffle_rows, rounded up to micro-batches; 0 = the biggest row group's
rows), each window's rows permuted with a generator seeded (trainer.seed, e, dp, r, window): the shuffle buffer.
Micro-batch i of the epoch is rows [i × m, (i + 1) × m) of the rank's shuffled part, so global micro-batch k =
e × P + i is known without reading anything before it: ``start=k`` opens the window that holds it and skips the
micro-batches before it in that window (exact resume: the same samples as the uninterrupted run, on the same dp and
micro-batch size; another dp deals the rows out anew).

Memory: a background thread (data.prefetch windows ahead; 0 = none) reads, decodes and shuffles windows while the
rank trains on the current one, so a rank holds about prefetch + 2 windows of decoded rows (float32 per continuous
column, int32 per field, a float32 label) and one row group as read, never a file: ``buffer_bytes``.

Each row group is read with the run's columns only, text columns kept as Parquet's dictionaries; categorical values
hashed as with one file (``_tabular_hash.bucket_ids``); continuous columns standardised with the mean and standard
deviation of a seeded sample of the train row groups (at least STATS_ROWS rows, data.seed: the same in every rank;
Parquet footers hold min / max but no mean or variance), a missing value as the mean; an inf, -inf or value beyond
float32 the footers did not show (``_tabular_files`` refuses what they show) stops the rank naming the column, file,
row group and row. Eval: the held-out row groups
in file order, rank r the rows [r × E // dp, (r + 1) × E // dp) of them, the same number of batches on every rank.
"""

from __future__ import annotations

import math
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator

import numpy as np
import torch

from launcher.recipes.wide_deep._tabular_columns import Finite
from launcher.recipes.wide_deep._tabular_files import Layout, layout
from launcher.recipes.wide_deep._tabular_hash import bucket_ids
from launcher.recipes.wide_deep._tabular_parquet import coded, floats
from launcher.recipes.wide_deep.tabular import TabularError, _cross, _float_lut

STATS_ROWS = 262_144
"""Rows (at least) of the train row groups whose continuous values give the standardisation."""
OPEN_FILES = 1
"""Parquet files a reading thread keeps open (footer parsed): an open file also keeps the bytes it pre-buffered for
its last row group, so more would make a rank's memory grow with the number of files (measured: +60 MiB at 4)."""


class Encoder:
    """A Layout's row groups read and turned into (float32 continuous, int32 ids, float32 labels) numpy arrays."""

    def __init__(self, layout: Layout, buckets: int, seed: int) -> None:
        self.layout, self.buckets, self.seed = layout, buckets, seed
        self._local = threading.local()  # open files per thread: a stream's reader, an abandoned one, eval's
        self._lock = threading.Lock()
        self._stats: tuple[np.ndarray, np.ndarray] | None = None

    def _file(self, f: int):
        import pyarrow.parquet as pq

        files = self._local.__dict__.setdefault("open", OrderedDict())
        if f not in files:
            files[f] = pq.ParquetFile(self.layout.files[f], read_dictionary=list(self.layout.text))
            if len(files) > OPEN_FILES:
                files.popitem(last=False)
        files.move_to_end(f)
        return files[f]

    def read(self, unit: np.ndarray, lo: int, hi: int, release: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows [lo, hi) of row group ``unit`` (file, group, rows), encoded; ``release``: then give the Arrow memory
        the read took back to the OS (``release_unused``). Evaluation's reads do: each evaluation reads on a thread of
        its own, and Arrow's pool (mimalloc) kept what those threads freed, so a rank's memory grew with the held-out
        set it streamed (docs/tabular_stream.md#memory). Training's reads do not: on its one reading thread the pool
        holds what one read needs, and giving it back costs the next read its page faults (~10 % of the data path's
        samples/s)."""
        import pyarrow as pa

        f, g = int(unit[0]), int(unit[1])
        table = self._file(f).read_row_group(g, columns=self.layout.columns, use_threads=False)
        out = self.encode(table.slice(lo, hi - lo), f, g, lo)
        del table
        if release:
            pa.default_memory_pool().release_unused()
        return out

    def encode(self, table, f: int, g: int, lo: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows [lo, lo + rows) of row group g of file f; TabularError for an inf the footers did not show."""
        lay = self.layout
        mean, std = self.stats()
        dense = np.empty((table.num_rows, len(lay.continuous)), np.float32)
        finite = self._finite(f, g)
        for j, h in enumerate(lay.continuous):
            x = self._floats(table.column(h))
            finite.add(h, x, lo + 1)
            x = (x - mean[j]) / std[j]
            dense[:, j] = np.where(np.isnan(x), 0.0, x)
        finite.check()
        cols = {h: coded(table.column(h)) for h in dict.fromkeys([*lay.categorical, *(c for p in lay.crosses
                                                                                         for c in p)])}
        fields = [cols[h] for h in lay.categorical] + [_cross(cols[a], cols[b], hashed=True) for a, b in lay.crosses]
        ids = np.empty((table.num_rows, len(fields)), np.int32)
        for j, col in enumerate(fields):
            ids[:, j] = bucket_ids(col.texts(), self.buckets)[0][col.codes]
        return dense, ids, self._labels(coded(table.column(lay.label)), f, g)

    def _floats(self, column) -> np.ndarray:
        if column.num_chunks and _is_text_type(column.type):  # data.continuous names a text column
            col = coded(column)
            return _float_lut(col)[0][col.codes]
        return floats(column)

    def _finite(self, f: int, g: int) -> Finite:
        """Footers without min / max (or a text column in data.continuous) let an inf through to here."""
        return Finite(f"data.path={self.layout.path}: row group {g} of {self.layout.files[f]} (rows counted from its "
                      f"first)")

    def _labels(self, col, f: int, g: int) -> np.ndarray:
        lay = self.layout
        texts = col.texts()
        other = sorted(set(texts) - {lay.positive, lay.negative})
        if other:  # "": a null or empty label (coded), which the footers did not count
            said = ", ".join("a missing (null or empty) value" if t == "" else t for t in other[:5])
            raise TabularError([f"data.label={lay.label}: row group {g} of {lay.files[f]} holds {said}, neither "
                                f"data.positive={lay.positive} nor the negative value {lay.negative}. Fix the file, or "
                                f"move it out of data.path."])
        return np.array([t == lay.positive for t in texts], np.float32)[col.codes]

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation) of each continuous column over a seeded sample of the train row groups."""
        with self._lock:
            if self._stats is None:
                self._stats = self._sample_stats()
        return self._stats

    def _sample_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Row group by row group (one held at a time), merged as Chan et al. do: count, mean, sum of squared
        deviations per column; NaN (missing) left out."""
        lay, cont = self.layout, list(self.layout.continuous)
        count, mean, m2 = np.zeros(len(cont)), np.zeros(len(cont)), np.zeros(len(cont))
        rows = 0
        for k in np.random.default_rng([self.seed % 2**64, 1]).permutation(len(lay.train)) if cont else ():
            f, g, n = (int(v) for v in lay.train[k])
            table = self._file(f).read_row_group(g, columns=cont, use_threads=False)
            finite = self._finite(f, g)
            for j, h in enumerate(cont):
                x = self._floats(table.column(h))
                finite.add(h, x)
                finite.check()
                x = x[~np.isnan(x)]
                if len(x):
                    delta, total = x.mean() - mean[j], count[j] + len(x)
                    m2[j] += ((x - x.mean()) ** 2).sum() + delta**2 * count[j] * len(x) / total
                    mean[j] += delta * len(x) / total
                    count[j] = total
            rows += n
            if rows >= STATS_ROWS:
                break
        std = np.sqrt(m2 / np.maximum(count - 1, 1))
        return mean, np.where((count > 1) & (std > 0), std, 1.0)


def _is_text_type(t) -> bool:
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)


def pieces(units: np.ndarray, a: int, b: int) -> Iterator[tuple[np.ndarray, int, int]]:
    """(row group, lo, hi) for rows [a, b) of the row groups ``units`` laid one after the other."""
    ends = np.cumsum(units[:, 2])
    k = int(np.searchsorted(ends, a, side="right"))
    while k < len(units) and ends[k] - units[k, 2] < b:
        start = int(ends[k] - units[k, 2])
        yield units[k], max(a, start) - start, min(b, int(ends[k])) - start
        k += 1


class Rows:
    """Decoded row-group pieces one after the other, taken n rows at a time into new arrays (ids as int64): no piece
    is copied twice and none is joined to the next."""

    def __init__(self, parts: Iterator[tuple], widths: tuple[int, int]) -> None:
        self.parts, self.widths = parts, widths
        self.piece: tuple | None = None
        self.at = 0

    def take(self, n: int, mix: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next n rows; with mix (a permutation of n), row j of the result is the mix[j]-th of them."""
        out = (np.empty((n, self.widths[0]), np.float32), np.empty((n, self.widths[1]), np.int64),
               np.empty(n, np.float32))
        where = None
        if mix is not None:  # where each row goes: the inverse permutation
            where = np.empty(n, np.int64)
            where[mix] = np.arange(n)
        done = 0
        while done < n:
            if self.piece is None:
                self.piece, self.at = next(self.parts), 0
            k = min(n - done, len(self.piece[-1]) - self.at)
            to = slice(done, done + k) if where is None else where[done:done + k]
            for o, src in zip(out, self.piece):
                o[to] = src[self.at:self.at + k]
            done, self.at = done + k, self.at + k
            if self.at == len(self.piece[-1]):
                self.piece = None  # not held while the window waits
        return out


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


JOIN_BOUND = 30.0
"""Seconds ``ahead`` waits, once its caller is done, for its thread's read in progress to finish."""


def ahead(make: Callable[[], Iterator], depth: int) -> Iterator:
    """The items of make(): the first on this thread (a caller that takes one, as the trainer's example batch
    does, starts no thread), the others made by a background thread up to ``depth`` ahead (0: on this thread); its
    errors raised here. Closing this generator stops the thread at its next item; once done, it waits for the
    thread to end (at most JOIN_BOUND seconds)."""
    made = make()
    for item in made:
        yield item
        break
    if depth <= 0:
        yield from made
        return
    items: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in made:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            put(_Failed(e))

    worker = threading.Thread(target=run, daemon=True, name="tabular-stream")
    worker.start()
    try:
        while (item := items.get()) is not _END:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        # Its last read finished before the caller goes on: a process that exits while the thread is still inside
        # Arrow's C++ code aborts ("terminate called without an active exception", 7 of 12 runs of
        # tests/recipes/test_tabular_stream_memory.py on a loaded 2-core VM). Bounded: a read of one row group.
        worker.join(JOIN_BOUND)


class StreamedTabular:
    """The data source of data=tabular over a directory or glob of Parquet files (see the module's docstring)."""

    def __init__(self, layout: Layout, buckets: int, seed: int, shuffle_rows: int = 0, prefetch: int = 1) -> None:
        self.layout, self.shuffle_rows, self.prefetch = layout, shuffle_rows, prefetch
        self.encoder = Encoder(layout, buckets, seed)
        self.train_rows = int(layout.train[:, 2].sum())
        self._widths = (len(layout.continuous), len(layout.fields))

    @classmethod
    def of(cls, path, label, positive, negative, categorical, continuous, drop, test_fraction, max_vocab, crosses,
           seed, hash_buckets, eval_path="", shuffle_rows=0, prefetch=1) -> StreamedTabular:
        """The source of data=tabular's keys (as TabularCTR takes them) for a directory or glob."""
        lay = layout(path, label, str(positive), str(negative), list(categorical), list(continuous), list(drop),
                     test_fraction, max_vocab, [list(c) for c in crosses], seed, hash_buckets, eval_path)
        return cls(lay, hash_buckets, seed, shuffle_rows, prefetch)

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The train row groups (file, group, rows) in epoch ``epoch``'s order."""
        return self.layout.train[np.random.default_rng([seed % 2**64, epoch]).permutation(len(self.layout.train))]

    def shape(self, dp_size: int, micro_size: int) -> tuple[int, int]:
        """(micro-batches per rank and epoch P, rows per window W: a multiple of micro_size, at most P × micro)."""
        per_epoch = self.train_rows // (micro_size * dp_size)
        if per_epoch < 1:
            raise ValueError(f"{self.train_rows} train rows make no global micro-batch of {micro_size} × {dp_size}")
        want = self.shuffle_rows or self.layout.group_rows
        return per_epoch, min(per_epoch, max(1, math.ceil(want / micro_size))) * micro_size

    def windows(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int) -> Iterator[tuple]:
        """(dense, ids, labels, first row) per shuffled window of this rank, from global micro-batch ``start`` on."""
        per_epoch, window = self.shape(dp_size, micro_size)
        part = per_epoch * micro_size
        epoch, i = divmod(start, per_epoch)
        first = i * micro_size // window  # the window holding micro-batch i
        skip = i * micro_size - first * window
        while True:
            order = self.epoch_order(seed, epoch)
            begin = dp_rank * part + first * window
            rows = Rows((self.encoder.read(*p) for p in pieces(order, begin, (dp_rank + 1) * part)), self._widths)
            for w in range(first, math.ceil(part / window)):
                size = min(window, part - w * window)
                mix = np.random.default_rng([seed % 2**64, epoch, dp_size, dp_rank, w]).permutation(size)
                yield (*rows.take(size, mix), skip)
                skip = 0
            epoch, first = epoch + 1, 0

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[tuple]:
        """Endless micro-batches of this rank from global micro-batch ``start`` (see the module's docstring)."""
        windows = ahead(lambda: self.windows(dp_rank, dp_size, micro_size, seed, start), self.prefetch)
        for dense, ids, y, skip in windows:
            dense, ids, y = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(y)
            for s in range(skip, len(y), micro_size):
                yield (dense[s:s + micro_size], ids[s:s + micro_size]), y[s:s + micro_size]

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[tuple]:
        """The held-out row groups in file order, this rank rows [r × E // dp, (r + 1) × E // dp) of them, in as many
        batches (of at most micro_size rows) as every other rank (count is ignored: the held-out set is finite)."""
        units = self.layout.eval
        rows = int(units[:, 2].sum())
        lo, hi = dp_rank * rows // dp_size, (dp_rank + 1) * rows // dp_size
        batches = max(1, math.ceil(math.ceil(rows / dp_size) / micro_size))
        n, extra = divmod(hi - lo, batches)
        sizes = [n + 1] * extra + [n] * (batches - extra)

        def chunks() -> Iterator[tuple]:
            rows = Rows((self.encoder.read(*p, release=True) for p in pieces(units, lo, hi)), self._widths)
            yield from (rows.take(size) for size in sizes)

        for dense, ids, y in ahead(chunks, self.prefetch):
            yield (torch.from_numpy(dense), torch.from_numpy(ids)), torch.from_numpy(y)
