"""data=tabular: column typing, split, vocabularies, sharding, and clear errors for bad files."""

import gzip

import pytest
import torch

from launcher.recipes.wide_deep.tabular import TabularCTR, TabularError, prepare
from tests.conftest import run_cli
from tests.data.make_ctr_csv import write_ctr_csv


@pytest.fixture
def csv_path(tmp_path):
    path = tmp_path / "ctr.csv"
    write_ctr_csv(str(path), 2000)
    return path


def test_columns_are_typed_split_and_encoded(csv_path):
    p = prepare(str(csv_path), "clicked", "yes", drop=["user_id"], test_fraction=0.25)
    assert p.continuous == ["age", "hours"] and p.categorical == ["job", "city", "device"]
    assert len(p.train[2]) == 1500 and len(p.test[2]) == 500
    dense, ids, y = p.train
    assert torch.allclose(dense.mean(0), torch.zeros(2), atol=1e-5)  # standardised with train statistics
    assert not torch.isnan(dense).any()  # missing hours -> train mean
    assert p.field_sizes[0] == 8 + 1 and p.field_sizes[2] == 3 + 1  # vocabulary + the out-of-vocabulary row
    assert all((ids[:, j] < s).all() for j, s in enumerate(p.field_sizes))
    assert set(y.tolist()) == {0.0, 1.0}


def test_explicit_types_hashing_and_crosses(csv_path):
    p = prepare(str(csv_path), "clicked", "yes", drop=["user_id"], categorical=["age"], max_vocab=50,
                crosses=[["job", "device"]])
    assert "age" in p.categorical and p.continuous == ["hours"]
    sizes = dict(zip(p.categorical, p.field_sizes))
    assert sizes["city"] == 50  # > max_vocab distinct values: hashed into 50 buckets
    assert sizes["job|device"] == 8 * 3 + 1


def test_gzip_csv_reads_the_same(csv_path, tmp_path):
    gz = tmp_path / "ctr.csv.gz"
    gz.write_bytes(gzip.compress(csv_path.read_bytes()))
    a, b = prepare(str(csv_path), "clicked", "yes"), prepare(str(gz), "clicked", "yes")
    assert torch.equal(a.train[1], b.train[1]) and torch.equal(a.test[0], b.test[0])


def test_shards_are_disjoint_covering_and_reshuffled_per_epoch(csv_path):
    data = TabularCTR(str(csv_path), "clicked", "yes", "", [], [], ["user_id"], 0.2, 1000, [], 0)
    dense_all = data.prepared.train[0]
    n, micro, world = len(dense_all), 50, 2
    per_epoch = n // (micro * world)  # the last partial global batch is dropped
    taken = {r: [] for r in range(world)}
    for rank in range(world):
        it = data.train_batches(rank, world, micro, seed=7)
        for _ in range(2 * per_epoch):
            (dense, _), _ = next(it)
            taken[rank].append(dense)
    for epoch, seed in enumerate((7, 8)):  # epoch e is shuffled with seed + e
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        mine = [torch.cat(taken[r][epoch * per_epoch : (epoch + 1) * per_epoch]) for r in range(world)]
        for rank in range(world):
            first = order[rank * micro : (rank + 1) * micro]
            assert torch.equal(mine[rank][:micro], dense_all[first])
        together = sorted(map(tuple, torch.cat(mine).tolist()))
        assert together == sorted(map(tuple, dense_all[order[: per_epoch * micro * world]].tolist()))  # disjoint, covering
    assert not torch.equal(taken[0][0], taken[0][per_epoch])  # reshuffled


def test_eval_covers_the_test_split_once(csv_path):
    data = TabularCTR(str(csv_path), "clicked", "yes", "", [], [], ["user_id"], 0.2, 1000, [], 0)
    batches = [list(data.eval_batches(r, 3, 64, count=0)) for r in range(3)]
    assert len({len(b) for b in batches}) == 1  # the same number of batches on every rank
    assert sum(len(y) for b in batches for _, y in b) == len(data.prepared.test[2])


@pytest.mark.parametrize(
    "make, kwargs, message",
    [
        (None, {"path": "missing.csv"}, r"data.path=missing.csv: no such file"),
        ("", {}, r"the file has no data rows"),
        ("a,b\n", {}, r"the file has no data rows"),
        ("x,clicked\n1,yes\n2,no\n", {"label": "click"}, r"data.label: column 'click' is not in .*Its columns: x, clicked"),
        ("x,clicked\n1,yes\n2,no\n3,maybe\n", {}, r"negative one is ambiguous\. Set data.negative=<value>"),
        ("x,clicked\n1,yes\n2,no\n3,maybe\n", {"negative": "no"}, r"values maybe are neither data.positive=yes nor data.negative=no"),
        ("x,clicked\n1,Y\n2,N\n", {}, r"data.positive=yes: no row of column 'clicked' has that value; its values: N, Y"),
    ],
)
def test_bad_files_are_named_with_a_fix(tmp_path, make, kwargs, message):
    path = tmp_path / "f.csv"
    if make is not None:
        path.write_text(make)
    args = {"path": str(path), "label": "clicked", "positive": "yes"} | kwargs
    with pytest.raises(TabularError, match=message):
        prepare(**args)


def test_cli_refuses_a_bad_file_before_starting(tmp_path):
    (tmp_path / "f.csv").write_text("x,clicked\n1,yes\n2,no\n")
    res = run_cli(["recipe=wide_deep", "data=tabular", "data.path=f.csv", "data.label=click", "data.positive=yes"], tmp_path)
    assert res.returncode == 2 and "data.label: column 'click' is not in" in res.stderr
    assert not (tmp_path / "log_output").exists()
    res = run_cli(["recipe=wide_deep", "data=tabular"], tmp_path)
    assert res.returncode == 2
    for key in ("data.path", "data.label", "data.positive"):
        assert f"{key} is required and not set" in res.stderr


# The column-wise reader (issue 21, item 10) against the per-cell one it replaced (tests/recipes/_tabular_reference.py):
# the same columns, vocabularies, standardisation and split, with pyarrow and with Python's csv module.

@pytest.fixture(params=["pyarrow", "csv module"])
def reader(request, monkeypatch):
    """Each reader, in small batches (so that batches' dictionaries are unified, as in a big file)."""
    from launcher.recipes.wide_deep import _tabular_read

    if request.param == "pyarrow":
        pytest.importorskip("pyarrow")
    else:
        monkeypatch.setattr(_tabular_read, "_pyarrow", lambda: None)
    monkeypatch.setattr(_tabular_read, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(_tabular_read, "CHUNK", 50)
    return request.param


def _tricky_csv(path, delimiter=",", bom=False, rows=400):
    """Stripped cells, missing values, "nan", numbers only Python reads (1_000), a mixed column, quoted separators and
    newlines, unicode order, cross values that collide (x|y + z = x + y|z), blank lines and rows of empty cells."""
    import csv
    import io
    import random

    rnd = random.Random(1)
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    w.writerow([" id ", "age", "score", "tag", "city", "note", "label"])
    for i in range(rows):
        age = rnd.choice([f" {rnd.randint(18, 80)} ", "", "1_000", "nan", str(rnd.randint(18, 80))])
        score = rnd.choice([f"{rnd.gauss(0, 3):.3f}", "", "1e3", "-0"])
        tag = rnd.choice(["1", "01", "a", " b ", "é", "Z", "ß", "日本", ""])
        city = rnd.choice(["x|y", "x", f"c{rnd.randint(0, 60)}", "q, \"r\"", "multi\nline"])
        note = rnd.choice(["z", "y|z", "", "n" + str(rnd.randint(0, 5))])
        label = rnd.choice([" yes", "no ", "yes", "no"])
        w.writerow([f"u{i}", age, score, tag, city, note, label])
        if i % 97 == 5:
            buf.write("\n   \n" + delimiter * 6 + "\n")
    path.write_bytes(("\ufeff" if bom else "").encode() + buf.getvalue().encode())
    return path


def _same(new, ref):
    assert (new.continuous, new.categorical, new.field_sizes) == (ref.continuous, ref.categorical, ref.field_sizes)
    for a, b in zip((*new.train, *new.test), (*ref.train, *ref.test)):
        assert a.shape == b.shape
        torch.testing.assert_close(a.to(b.dtype), b, rtol=0, atol=0, equal_nan=True)
    assert (new.train_rows, new.test_rows) == (len(ref.train[2]), len(ref.test[2]))
    assert new.train_positive == float(ref.train[2].mean())


CASES = [
    {"drop": ["user_id"]},
    {"categorical": ["age"], "max_vocab": 50, "crosses": [["job", "device"], ["city", "job"]], "test_fraction": 0.3,
     "seed": 3},
    {"continuous": ["job"], "drop": ["device"]},
]


@pytest.mark.parametrize("kwargs", CASES)
def test_the_column_wise_reader_prepares_what_the_per_cell_one_did(csv_path, reader, kwargs):
    from tests.recipes import _tabular_reference as ref

    new = prepare(str(csv_path), "clicked", "yes", **kwargs)
    _same(new, ref.prepare(str(csv_path), "clicked", "yes", **kwargs))
    facts = prepare(str(csv_path), "clicked", "yes", **kwargs, tensors=False)  # what the launcher asks for
    assert facts.train is None and (facts.field_sizes, facts.train_rows) == (new.field_sizes, new.train_rows)
    assert new.reader == ("pyarrow" if reader == "pyarrow" else "Python's csv module")


@pytest.mark.parametrize("kwargs", [{}, *CASES])
def test_resident_bytes_are_what_a_rank_keeps(csv_path, reader, kwargs):
    """DataFacts.resident_bytes, from the launcher's read of the facts, is the sum of the bytes of the arrays a
    rank's data source keeps (train and test splits), byte for byte."""
    from launcher.recipes.wide_deep import RECIPE, TabularDataConfig

    config = TabularDataConfig(path=str(csv_path), label="clicked", positive="yes", **kwargs)
    facts = RECIPE.data_facts(config)
    args = {k: v for k, v in vars(config).items() if k != "_target_"}
    rank = TabularCTR(**args)
    arrays = (*rank.prepared.train, *rank.prepared.test)
    assert facts.resident_bytes == sum(t.nbytes for t in arrays) > 0
    assert [t.dtype for t in arrays] == [torch.float32, torch.int32, torch.float32] * 2


@pytest.mark.parametrize("delimiter, bom", [(",", False), (";", True), ("\t", False)])
@pytest.mark.parametrize("kwargs", [{}, {"drop": ["id"], "max_vocab": 8, "crosses": [["city", "note"]]},
                                    {"categorical": ["score"], "continuous": ["tag"], "negative": "no"}])
def test_odd_cells_read_as_before(tmp_path, reader, delimiter, bom, kwargs):
    from tests.recipes import _tabular_reference as ref

    path = _tricky_csv(tmp_path / "odd.csv", delimiter, bom)
    new = prepare(str(path), "label", "yes", **kwargs)
    _same(new, ref.prepare(str(path), "label", "yes", **kwargs))
    assert new.train_rows + new.test_rows == 400  # blank lines and rows of empty cells skipped
    assert new.reader == ("pyarrow" if reader == "pyarrow" else "Python's csv module")


def test_blank_rows_before_the_header_are_skipped(tmp_path, reader):
    from tests.recipes import _tabular_reference as ref

    path = _tricky_csv(tmp_path / "odd.csv")
    path.write_bytes(b"\n   \n" + b",,,,,,\n" * 600 + path.read_bytes())  # more than a first batch of blank rows
    new = prepare(str(path), "label", "yes", drop=["id"])
    _same(new, ref.prepare(str(path), "label", "yes", drop=["id"]))
    assert new.continuous == ["age", "score"]


def test_gzip_and_parquet_read_as_before(csv_path, tmp_path, reader):
    from tests.recipes import _tabular_reference as ref

    gz = tmp_path / "ctr.csv.gz"
    gz.write_bytes(gzip.compress(csv_path.read_bytes()))
    _same(prepare(str(gz), "clicked", "yes"), ref.prepare(str(gz), "clicked", "yes"))
    if reader != "pyarrow":
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 300
    table = pa.table({
        "age": pa.array([None if i % 17 == 0 else 20 + i % 50 for i in range(n)], pa.int64()),
        "score": pa.array([float("nan") if i % 13 == 0 else None if i % 11 == 0 else i / 7 for i in range(n)]),
        "job": pa.array([None if i % 19 == 0 else ["a", "b ", "", "é"][i % 4] for i in range(n)]),
        "flag": pa.array([i % 3 == 0 for i in range(n)]),
        "clicked": pa.array([i % 5 == 0 for i in range(n)]),
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=64)
    for kwargs in ({}, {"categorical": ["age", "score"], "crosses": [["job", "flag"]], "max_vocab": 20}):
        new = prepare(str(tmp_path / "t.parquet"), "clicked", "True", **kwargs)
        _same(new, ref.prepare(str(tmp_path / "t.parquet"), "clicked", "True", **kwargs))


def _cli(tmp_path, monkeypatch, path, *extra):
    from launcher.cli import main

    monkeypatch.chdir(tmp_path)
    return main(["recipe=wide_deep", "data=tabular", f"data.path={path}", "data.label=clicked", "data.positive=yes",
                 "dry_run=true", *extra])


def _truncated_parquet(path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the message is then pyarrow's install hint, which names the file too
        path.write_bytes(b"PAR1" + bytes(range(256)) * 4)
        return
    pq.write_table(pa.table({"x": list(range(1000)), "clicked": ["yes", "no"] * 500}), path)
    path.write_bytes(path.read_bytes()[:-200])  # the footer cut off


@pytest.mark.parametrize("name, write, message", [
    ("random.csv", lambda p: p.write_bytes(__import__("random").Random(0).randbytes(5000)),
     r"holds binary bytes, not CSV text\. Give a UTF-8 CSV"),
    ("cut.parquet", _truncated_parquet, r"(cannot be read as Parquet .*: cut short or not Parquet\. Write the file "
                                        r"again whole|reading Parquet needs pyarrow\. Install it)"),
    ("cut.csv.gz", lambda p: p.write_bytes(gzip.compress("x,clicked\n".encode() + "".join(
        f"{i},{'yes' if i % 3 else 'no'}\n" for i in range(5000)).encode())[:2000]),
     r"cannot be read as a table"),
    ("parquet.csv", lambda p: p.write_bytes(b"PAR1" + bytes(100)), r"is a Parquet file named as a CSV\. Rename it"),
    ("empty.csv", lambda p: p.write_bytes(b""), r"the file has no data rows"),
    ("header.csv", lambda p: p.write_text("x,clicked\n"), r"the file has no data rows"),
    ("ragged.csv", lambda p: p.write_text("x,clicked\n1,yes\n2,no,3\n"), r"has 3 fields, the header has 2"),
], ids=["random-bytes.csv", "truncated.parquet", "truncated.csv.gz", "parquet-named.csv", "empty", "header-only",
        "ragged"])
def test_a_bad_data_file_exits_2_naming_it(tmp_path, monkeypatch, capsys, reader, name, write, message):
    path = tmp_path / name
    write(path)
    assert _cli(tmp_path, monkeypatch, path) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"data.path={path}" in err and "Traceback" not in err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "log_output").exists()


def test_ctrl_c_while_reading_the_data_ends_as_an_interrupt(tmp_path, monkeypatch, capsys, csv_path):
    from launcher.recipes.wide_deep import _tabular_read

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_tabular_read, "read_table", interrupted)
    monkeypatch.setattr("launcher.recipes.wide_deep.tabular.read_table", interrupted)
    assert _cli(tmp_path, monkeypatch, csv_path) == 130
    assert capsys.readouterr().err.strip() == "hetero-launch: interrupted while planning; nothing was started"
