"""data=tabular over a directory or glob of Parquet files, streamed by row group: what each rank reads (pyarrow's own
read_row_group, spied on), exact positions from the footers, eval, hashing as with one file, and bad input named
before anything starts."""

import itertools
import math

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from launcher.cli import main  # noqa: E402
from launcher.recipes.wide_deep._tabular_files import layout, stream_facts  # noqa: E402
from launcher.recipes.wide_deep._tabular_stream import STATS_ROWS  # noqa: E402
from launcher.recipes.wide_deep.tabular import TabularCTR, TabularError, _bucket  # noqa: E402

GROUPS = (300, 300, 250, 300, 200, 300, 150, 300, 280)
"""Rows of each row group (3 per file), the last of a file often shorter, as writers leave them."""
BUCKETS = 64


def _columns(first: int, n: int) -> dict:
    row = np.arange(first, first + n)
    return {"label": pa.array((row * 7919 % 10 < 3).astype(np.int8)),
            "row": pa.array(row.astype(np.float64)),  # continuous: names the row in what a rank gets
            "x": pa.array(np.sin(row) * 10, mask=row % 11 == 0),
            "c": pa.array([f"v{r % 37}" for r in row], mask=row % 13 == 0),
            "k": pa.array(row % 5, pa.int64())}


def write_dir(root, groups=GROUPS, per_file: int = 3, start: int = 0):
    """Parquet files under root of the row groups ``groups`` (rows each), row ids from start on."""
    root.mkdir(parents=True, exist_ok=True)
    at = start
    for f in range(math.ceil(len(groups) / per_file)):
        with pq.ParquetWriter(root / f"part-{f}.parquet", pa.table(_columns(1, 1)).schema) as w:
            for n in groups[f * per_file:(f + 1) * per_file]:
                w.write_table(pa.table(_columns(at, n)), row_group_size=n)
                at += n
    return root


def source(path, **kw) -> TabularCTR:
    args = {"categorical": ["k"], "test_fraction": 0.2, "hash_buckets": BUCKETS, "prefetch": 0} | kw
    return TabularCTR(str(path), "label", "1", "", args["categorical"], [], [], args["test_fraction"], 100_000, [], 0,
                      args["hash_buckets"], kw.get("eval_path", ""), kw.get("shuffle_rows", 0), args["prefetch"])


@pytest.fixture
def reads(monkeypatch):
    """pyarrow's ParquetFile.read_row_group, spied on: (file, row group, columns) of each call, in order."""
    calls = []
    init, read = pq.ParquetFile.__init__, pq.ParquetFile.read_row_group

    def spied_init(self, source, *a, **kw):
        self.spied_path = str(source)
        init(self, source, *a, **kw)

    def spied_read(self, i, columns=None, *a, **kw):
        calls.append((self.spied_path, i, tuple(columns or ())))
        return read(self, i, columns, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "__init__", spied_init)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spied_read)
    return calls


def _rows(batches) -> list[int]:
    """The row ids of micro-batches (column 0, ``row``, standardised: undone by its order)."""
    return [float(v) for (dense, _), _ in batches for v in dense[:, 0].tolist()]


def test_each_rank_reads_only_the_row_groups_of_its_part(tmp_path, reads):
    data = source(write_dir(tmp_path / "d")).stream
    data.encoder.stats()  # every rank's one read of the continuous columns of a sample (here: every train row)
    lay, m, seed = data.layout, 40, 3
    ids = {}  # (file, group) -> its row ids
    at = 0
    for k, n in enumerate(GROUPS):
        ids[(str(tmp_path / "d" / f"part-{k // 3}.parquet"), k % 3)] = list(range(at, at + n))
        at += n
    for dp in (2, 3):
        per_epoch = data.train_rows // (m * dp)
        order = [(lay.files[f], g) for f, g, _ in data.epoch_order(seed, 0)]
        stream = [r for unit in order for r in ids[unit]]  # the epoch's rows, row group after row group
        part = per_epoch * m
        seen = []
        for rank in range(dp):
            reads.clear()
            got = _rows(itertools.islice(data.train_batches(rank, dp, m, seed), per_epoch))
            mine = set(stream[rank * part:(rank + 1) * part])
            expected = [u for u in order if mine & set(ids[u])]
            assert [(f, g) for f, g, cols in reads] == expected, (dp, rank)  # its own row groups, each once
            assert all("label" in cols for _, _, cols in reads)
            assert len(set(got)) == part  # distinct rows
            seen.append(got)
        together = np.concatenate(seen)
        assert len(np.unique(together)) == dp * part  # disjoint; the tail left out is under one global batch
        assert data.train_rows - dp * part < m * dp


def test_start_k_is_the_uninterrupted_stream_from_micro_batch_k(tmp_path):
    """Windows of 3 micro-batches, 2 ranks: micro-batch k of a fresh stream is micro-batch k of one that never
    stopped, mid-window and past epoch ends (the ranks' streams are read in a background thread too)."""
    data = source(write_dir(tmp_path / "d"), shuffle_rows=100, prefetch=1).stream
    m, dp, seed = 40, 2, 5
    per_epoch = data.train_rows // (m * dp)
    total = 2 * per_epoch + 3
    for rank in range(dp):
        whole = list(itertools.islice(data.train_batches(rank, dp, m, seed), total))
        for k in (1, 3, 4, per_epoch - 1, per_epoch, per_epoch + 2, 2 * per_epoch + 1):
            resumed = list(itertools.islice(data.train_batches(rank, dp, m, seed, start=k), total - k))
            for (a, b) in zip(whole[k:], resumed, strict=True):
                assert torch.equal(a[0][0], b[0][0]) and torch.equal(a[0][1], b[0][1]) and torch.equal(a[1], b[1])
    assert _rows(whole[:per_epoch]) != _rows(whole[per_epoch:2 * per_epoch])  # each epoch in another order


def test_eval_reads_the_held_out_rows_once_in_equal_batches(tmp_path):
    data = source(write_dir(tmp_path / "d")).stream
    assert len(data.layout.eval) == round(len(GROUPS) * 0.2)
    for dp in (1, 2, 3):
        batches = [list(data.eval_batches(r, dp, 64, count=0)) for r in range(dp)]
        assert len({len(b) for b in batches}) == 1 and all(len(y) <= 64 for b in batches for _, y in b)
        rows = _rows([b for part in batches for b in part])
        assert len(rows) == int(data.layout.eval[:, 2].sum()) == len(set(rows))
    other = source(write_dir(tmp_path / "d"), eval_path=str(write_dir(tmp_path / "e", (120, 80), start=10_000)))
    assert int(other.stream.layout.train[:, 2].sum()) == sum(GROUPS)  # every row group of data.path trains
    assert len(_rows(other.eval_batches(0, 1, 64, 0))) == 200


def test_values_are_hashed_and_standardised_as_with_one_file(tmp_path):
    data = source(write_dir(tmp_path / "d"), categorical=["k", "c"]).stream
    assert data.layout.continuous == ("row", "x") and data.layout.fields == ["c", "k"]
    assert sum(GROUPS) < STATS_ROWS  # the sample is every train row
    train_rows = np.concatenate([np.arange(sum(GROUPS[:k]), sum(GROUPS[:k + 1]))
                                 for k in range(len(GROUPS)) if (k // 3, k % 3) in
                                 {(int(f), int(g)) for f, g, _ in data.layout.train}])
    x = _columns(0, sum(GROUPS))["x"].to_numpy(zero_copy_only=False)[train_rows]
    mean, std = np.nanmean(x), np.nanstd(x, ddof=1)
    row_mean, row_std = train_rows.mean(), train_rows.std(ddof=1)
    (dense, ids), y = next(data.train_batches(0, 1, 500, seed=0))
    rows = np.rint(dense[:, 0].double().numpy() * row_std + row_mean).astype(int)
    ref = _columns(0, sum(GROUPS))
    for j, r in enumerate(rows.tolist()):
        c, k, xv = ref["c"][r].as_py(), ref["k"][r].as_py(), ref["x"][r].as_py()
        assert ids[j, 0] == (0 if c is None else _bucket(c, BUCKETS)) and ids[j, 1] == _bucket(str(k), BUCKETS)
        assert dense[j, 1].item() == pytest.approx(0.0 if xv is None else (xv - mean) / std, abs=1e-5)
        assert y[j].item() == ref["label"][r].as_py()


def test_the_launcher_reads_footers_and_one_label_column(tmp_path, reads):
    from launcher.recipes.wide_deep import TabularDataConfig

    cfg = TabularDataConfig(path=str(write_dir(tmp_path / "d")), label="label", positive="1", categorical=["k"],
                            hash_buckets=BUCKETS)
    lay, lines, held = stream_facts(cfg)
    assert [cols for _, _, cols in reads] == [("label",)]  # the first train row group's label column, nothing else
    assert "3 Parquet file(s) streamed by row group" in lines[0] and held > 0


def _other_schema(root):
    write_dir(root)
    pq.write_table(pa.table({**_columns(0, 10), "k": pa.array([str(i) for i in range(10)])}), root / "z.parquet")


BAD = [
    ("empty", lambda r: r.mkdir(), "", r"data.path=.*: the directory holds no file"),
    ("glob", lambda r: write_dir(r), "/*.pq", r"the glob matches no file .*\*.parquet"),
    ("schema", _other_schema, "", r"z.parquet has another schema than .*part-0.parquet: column 'k' is string there and "
                                  r"int64 in the first file"),
    ("lacks", lambda r: (write_dir(r), pq.write_table(pa.table({"label": [1]}), r / "z.parquet")), "",
     r"z.parquet has another schema .* it lacks column\(s\) row, x, c, k"),
    ("csv", lambda r: (write_dir(r), (r / "more.csv").write_text("a\n1\n")), "", r"more.csv is a CSV file .*Convert"),
    ("stray", lambda r: (write_dir(r), (r / "notes.txt").write_text("x"), (r / "a.json").write_text("{}")), "",
     r"a.json is not a Parquet file \(2 of 5 are not"),
    ("cut", lambda r: (write_dir(r), (r / "z.parquet").write_bytes(b"PAR1 cut short")), "",
     r"z.parquet: cannot be read as Parquet"),
]


@pytest.mark.parametrize("name, make, suffix, message", BAD, ids=[b[0] for b in BAD])
def test_bad_files_are_named_with_a_fix(tmp_path, name, make, suffix, message):
    make(tmp_path / "d")
    with pytest.raises(TabularError, match=message):
        layout(str(tmp_path / "d") + suffix, "label", "1", categorical=["k"], hash_buckets=BUCKETS)


def test_vocabularies_and_a_single_row_group_are_refused(tmp_path):
    with pytest.raises(TabularError, match=r"data.hash_buckets=0 builds vocabularies .* Set data.hash_buckets=1000000"):
        layout(str(write_dir(tmp_path / "d")), "label", "1", categorical=["k"])
    with pytest.raises(TabularError, match=r"1 row group\(s\) leave nothing to train on .* data.eval_path"):
        layout(str(write_dir(tmp_path / "one", (100,))), "label", "1", categorical=["k"], hash_buckets=BUCKETS)
    with pytest.raises(TabularError, match=r"data.positive=yes: no row .* \(streamed data: the values of row group"):
        layout(str(tmp_path / "d"), "label", "yes", categorical=["k"], hash_buckets=BUCKETS)
    inferred = layout(str(tmp_path / "d"), "label", "", categorical=["k"], hash_buckets=BUCKETS)  # a 0/1 label
    assert (inferred.positive, inferred.negative) == ("1", "0")


@pytest.mark.parametrize("args, message", [
    (["data.path={d}/empty"], "data.path={d}/empty: the directory holds no file"),
    (["data.path={d}/mixed"], "z.parquet has another schema than"),
    (["data.path={d}/none/*.parquet"], "the glob matches no file"),
    (["data.path={d}/ok/part-0.parquet", "data.eval_path={d}/ok"], "data.eval_path={d}/ok is for streamed data"),
])
def test_the_cli_refuses_bad_streamed_data_before_starting(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    _other_schema(tmp_path / "mixed")
    write_dir(tmp_path / "ok")
    logs = tmp_path / "logs"
    code = main(["recipe=wide_deep", "data=tabular", "data.label=label", "data.positive=1", "data.hash_buckets=64",
                 f"output.log_dir={logs}", *(a.format(d=tmp_path) for a in args)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and message.format(d=tmp_path) in err, err
    assert not logs.exists()


def test_one_file_with_dictionary_columns_reads_as_before(tmp_path):
    """A Parquet file whose text columns pyarrow wrote as dictionaries (with nulls) reads as one file (it used to
    stop on dictionary_encode) and as a directory, with the same ids."""
    table = pa.table(_columns(0, 400))
    table = table.set_column(3, "c", table.column("c").dictionary_encode())
    pq.write_table(table, tmp_path / "one.parquet", row_group_size=100)
    from launcher.recipes.wide_deep.tabular import prepare

    p = prepare(str(tmp_path / "one.parquet"), "label", "1", categorical=["k"], hash_buckets=BUCKETS)
    assert p.categorical == ["c", "k"] and len(p.train[1]) == 320
    (tmp_path / "dir").mkdir()
    (tmp_path / "one.parquet").rename(tmp_path / "dir" / "one.parquet")
    (dense, ids), _ = next(source(tmp_path / "dir").train_batches(0, 1, 100, 0))
    assert set(ids[:, 0].tolist()) <= {0} | {_bucket(f"v{i}", BUCKETS) for i in range(37)}


def test_a_file_whose_name_looks_like_a_glob_is_that_file(tmp_path):
    from launcher.recipes.wide_deep._tabular_read import is_streamed

    (tmp_path / "clicks[1].csv").write_text("a,clicked\n1,yes\n")
    assert not is_streamed(str(tmp_path / "clicks[1].csv")) and not is_streamed(str(tmp_path / "none.csv"))
    assert is_streamed(str(tmp_path)) and is_streamed(str(tmp_path / "*.parquet"))


def _with_inf(root, statistics: bool):
    """write_dir's row groups with row 400's ``x`` inf (row group 1 of part-0, row 101 of it) and row 1400's -inf."""
    root.mkdir(parents=True)
    at = 0
    for f in range(3):
        with pq.ParquetWriter(root / f"part-{f}.parquet", pa.table(_columns(1, 1)).schema,
                              write_statistics=statistics) as w:
            for n in GROUPS[f * 3:(f + 1) * 3]:
                cols = _columns(at, n)
                x = cols["x"].to_numpy(zero_copy_only=False)
                x[[k for k in range(n) if at + k in (400, 1400)]] = [np.inf, -np.inf][:sum(at <= r < at + n
                                                                                          for r in (400, 1400))]
                cols["x"] = pa.array(x)
                w.write_table(pa.table(cols), row_group_size=n)
                at += n
    return root


def test_inf_in_a_continuous_column_is_refused_from_the_footers(tmp_path, capsys, monkeypatch):
    root = _with_inf(tmp_path / "d", statistics=True)
    with pytest.raises(TabularError) as e:
        layout(str(root), "label", "1", categorical=["k"], hash_buckets=BUCKETS)
    [problem] = e.value.problems
    assert __import__("re").sub(r"\(min [-0-9.]+, ", "(min m, ", problem) == (
        f"data.path={root}: continuous column 'x' holds values that are not finite numbers (inf, -inf, or beyond "
        f"float32's +-3.4e38) in 2 row group(s) by the footers' min / max, the first row group 1 of "
        f"{root / 'part-0.parquet'} (min m, max inf); standardised, the column would be NaN and training would "
        f"diverge at step 1. Clean the column (a null is a missing value: the train mean), or set "
        f"data.categorical=[x] to hash its values as categories, or data.drop=[x].")
    monkeypatch.chdir(tmp_path)
    assert main(["recipe=wide_deep", "data=tabular", "data.path=d", "data.label=label", "data.hash_buckets=64",
                 "data.categorical=[k]", "dry_run=true"]) == 2
    assert "continuous column 'x' holds values that are not finite" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "log_output").exists()


@pytest.mark.parametrize("stats_rows", [STATS_ROWS, 1], ids=["seen-by-the-statistics", "seen-when-read"])
def test_a_rank_refuses_an_inf_the_footers_did_not_show(tmp_path, monkeypatch, stats_rows):
    monkeypatch.setattr("launcher.recipes.wide_deep._tabular_stream.STATS_ROWS", stats_rows)
    root = _with_inf(tmp_path / "d", statistics=False)
    data = source(root, test_fraction=0.12)
    with pytest.raises(TabularError, match=r"data.path=.*: row group \d of .*part-\d.parquet \(rows counted from its "
                                           r"first\): continuous column 'x' holds 1 value\(s\) that are not finite "
                                           r"numbers .* the first -?inf at data row \d+;"):
        list(itertools.islice(data.train_batches(0, 1, 40, 0), 200))


def _with_null_labels(root, statistics: bool):
    """write_dir's files, but the last file's label null in every 17th row (footers with or without statistics)."""
    write_dir(root, GROUPS[:6])
    cols = _columns(5000, 300)
    cols["label"] = pa.array(cols["label"].to_numpy(zero_copy_only=False), mask=np.arange(300) % 17 == 0)
    pq.write_table(pa.table(cols), root / "part-9.parquet", row_group_size=150, write_statistics=statistics)
    return root


def test_null_labels_are_refused_from_the_footers_and_named_by_the_rank_that_meets_them(tmp_path, capsys,
                                                                                       monkeypatch):
    root = _with_null_labels(tmp_path / "d", statistics=True)
    with pytest.raises(TabularError) as e:
        layout(str(root), "label", "1", categorical=["k"], hash_buckets=BUCKETS)
    [problem] = e.value.problems
    assert problem == (f"data.label=label: rows without a label (null), by the files' footers: 9 in row group 0 of "
                       f"{root / 'part-9.parquet'}; 9 in row group 1 of {root / 'part-9.parquet'}. A row needs its "
                       f"label to train or to be scored: drop those rows or fill their label, or move the files out "
                       f"of data.path.")
    monkeypatch.chdir(tmp_path)
    assert main(["recipe=wide_deep", "data=tabular", "data.path=d", "data.label=label", "data.positive=1",
                 "data.hash_buckets=64", "data.categorical=[k]", "dry_run=true"]) == 2
    assert "rows without a label (null)" in " ".join(capsys.readouterr().err.split())
    hidden = _with_null_labels(tmp_path / "hidden", statistics=False)  # no footer counts them: the rank names them
    data = source(hidden, test_fraction=0.12)
    with pytest.raises(TabularError, match=r"data.label=label: row group \d of .*part-9.parquet holds a missing \(null "
                                           r"or empty\) value, neither data.positive=1 nor the negative value 0"):
        list(itertools.islice(data.train_batches(0, 1, 40, 0), 400))


@pytest.mark.parametrize("taken", [None, 2])  # every item; the consumer stops after two
def test_the_reading_thread_has_ended_when_the_stream_is_done(taken):
    """A process that exits while the stream's thread is still inside Arrow's C++ code aborts ("terminate called
    without an active exception"): once its consumer is done, ``ahead`` waits for its thread, here still closing its
    source (a sleep in the source's cleanup) when the last item has been taken."""
    import threading
    import time

    from launcher.recipes.wide_deep._tabular_stream import ahead

    def source():
        try:
            yield from range(5)
        finally:
            time.sleep(0.3)

    stream = ahead(source, 2)
    got = list(stream) if taken is None else [next(stream) for _ in range(taken)]
    if taken is not None:
        stream.close()
    assert got == list(range(5 if taken is None else taken))
    assert not [t for t in threading.enumerate() if t.name == "tabular-stream"]
