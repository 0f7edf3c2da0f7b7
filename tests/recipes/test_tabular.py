"""data=tabular: column typing, split, vocabularies, sharding, and clear errors for bad files."""

import gzip

import pytest
import torch

from launcher.recipes.wide_deep.tabular import TabularCTR, TabularError, prepare
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


@pytest.mark.parametrize("yes, no", [("1", "0"), ("True", "False"), ("true", "false")])
@pytest.mark.parametrize("buckets", [0, 64])
def test_a_0_1_or_boolean_label_needs_no_positive(csv_path, tmp_path, yes, no, buckets):
    """Without data.positive, a label column of 0/1 or true/false takes 1 / true as the positive: the same labels as
    data.positive=<that value>, with vocabularies and with hashed ids."""
    text = csv_path.read_text().replace(",yes\n", f",{yes}\n").replace(",no\n", f",{no}\n")
    path = tmp_path / "binary.csv"
    path.write_text(text)
    inferred = prepare(str(path), "clicked", "", drop=["user_id"], hash_buckets=buckets)
    given = prepare(str(path), "clicked", yes, drop=["user_id"], hash_buckets=buckets)
    assert torch.equal(inferred.train[2], given.train[2]) and 0 < inferred.train[2].mean() < 1
    assert torch.equal(inferred.test[2], given.test[2])


@pytest.mark.parametrize("buckets", [0, 64])
def test_integer_ids_are_categorical_by_their_names(tmp_path, buckets):
    """MovieLens-shaped: integer user_id and movieId are ids, not numbers; age stays continuous; the note says so."""
    rows = ["user_id,movieId,age,rating_ge_4"] + [f"{i % 97},{(i * 7) % 301},{20 + i % 50},{i % 3 == 0:d}"
                                                   for i in range(600)]
    (tmp_path / "ratings.csv").write_text("\n".join(rows) + "\n")
    p = prepare(str(tmp_path / "ratings.csv"), "rating_ge_4", "", hash_buckets=buckets)
    assert p.continuous == ["age"] and sorted(p.categorical) == ["movieId", "user_id"]
    assert "categorical: named as ids (data.continuous=[user_id] would keep one a number)" in p.note, p.note
    kept = prepare(str(tmp_path / "ratings.csv"), "rating_ge_4", "", continuous=["user_id"], hash_buckets=buckets)
    assert kept.continuous == ["user_id", "age"] and kept.categorical == ["movieId"]


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


def test_cli_refuses_a_bad_file_before_starting(tmp_path, cli):
    (tmp_path / "f.csv").write_text("x,clicked\n1,yes\n2,no\n")
    res = cli(["recipe=wide_deep", "data=tabular", "data.path=f.csv", "data.label=click", "data.positive=yes"], tmp_path)
    assert res.returncode == 2 and "data.label: column 'click' is not in" in res.stderr
    assert not (tmp_path / "log_output").exists()
    res = cli(["recipe=wide_deep", "data=tabular"], tmp_path)
    assert res.returncode == 2
    for key in ("data.path", "data.label"):
        assert f"{key} is required and not set" in res.stderr
    res = cli(["recipe=wide_deep", "data=tabular", "data.path=f.csv", "data.label=clicked"], tmp_path)
    assert res.returncode == 2 and ("data.label=clicked: data.positive is not set and column 'clicked' is not a 0/1 "
                                    "or true/false label (its values: no, yes). Set data.positive to the "
                                    "clicked/positive value, e.g. data.positive=yes, or data.label to the label "
                                    "column.") in " ".join(res.stderr.split()), res.stderr


def test_a_column_named_for_two_things_is_refused():
    """Each was settled without a word: continuous won over categorical, the label stayed though dropped, drop won
    over the others."""
    from launcher.recipes.wide_deep._tabular_columns import column_conflicts

    assert column_conflicts("clicked", ["age"], ["age"], [], []) == [
        "data.categorical and data.continuous both name age: a column is one or the other (ids in a vocabulary, or a "
        "standardised number). Remove it from one of them."]
    assert column_conflicts("clicked", ["clicked"], [], ["clicked"], []) == [
        "data.label=clicked is also in data.categorical: the label is what the model predicts, never one of its "
        "features. Remove it from data.categorical.",
        "data.label=clicked is also in data.drop: the label column is read as the label whatever data.drop says. "
        "Remove it from data.drop."]
    assert column_conflicts("y", [], [], ["city", "age"], [["city", "zip"]]) == [
        "data.drop and data.crosses both name city: a dropped column is not read. Remove it from one of them."]
    assert column_conflicts("y", ["a"], ["b"], ["c"], [["a", "b"]]) == []


def test_a_file_without_a_categorical_column_is_told_how_to_name_one(tmp_path, cpu_host):
    """Its message had named model.num_dense and model.num_sparse, which the file sets ("num_dense=1 must be >= 0")."""
    from launcher.errors import ConfigError
    from tests.conftest import plan_of

    (tmp_path / "f.csv").write_text("age,clicked\n" + "".join(f"{i * 0.5},{i % 2}\n" for i in range(400)))
    base = ["recipe=wide_deep", "data=tabular", f"data.path={tmp_path / 'f.csv'}", "data.label=clicked",
            "batch.global_size=64"]
    with pytest.raises(ConfigError) as e:
        plan_of(base, cpu_host)
    assert e.value.problems == [
        f"data.path={tmp_path / 'f.csv'} gives no categorical column (every feature left after data.label and "
        f"data.drop reads as a number), and the deep part embeds at least one. Name a column of ids or categories "
        f"with data.categorical=[<column>] (a numeric one too), or a cross with data.crosses=[[<column>, <column>]]."]
    plan_of([*base, "data.categorical=[age]"], cpu_host)  # the fix plans


def test_a_label_column_with_missing_values_says_so():
    """Null labels read as an empty value: "values  are neither ..." had followed data.negative=0, and no value could
    name them. A column of positives and blanks with data.positive alone trains as before (the rest negative)."""
    from launcher.recipes.wide_deep._tabular_columns import _check_labels

    for positive, negative in (("", ""), ("1", ""), ("1", "0")):
        with pytest.raises(TabularError, match=r"data.label=clicked: some rows of column 'clicked' have no label \(blank "
                                               r"or null; its other values: 0, 1\)"):
            _check_labels("clicked", positive, negative, ["", "0", "1"])
    assert _check_labels("clicked", "", "", ["0", "1"]) == "1"
    assert _check_labels("clicked", "1", "", ["", "1"]) == "1"  # clicks and blanks, data.positive=1: blanks negative


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


# data.hash_buckets: every categorical field hashed from its raw values as the file streams by, no vocabulary.

def _hashed_by_row(p, n, test_fraction=0.2, seed=0):
    """The rank's ids of every row back in file order (the split is randperm(n, seed), its first part the test)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = max(1, int(round(n * test_fraction)))
    ids = torch.empty(n, p.train[1].shape[1], dtype=torch.int32)
    ids[order[n_test:]], ids[order[:n_test]] = p.train[1], p.test[1]
    return ids


def _raw_fields(path, fields):
    """{field: its raw value per row, "" = missing} from the per-cell reference reader; a cross a|b is missing when
    either side is."""
    from pathlib import Path

    from tests.recipes._tabular_reference import _read

    header, rows = _read(Path(path))
    col = {h: i for i, h in enumerate(header)}
    out = {}
    for f in fields:
        a, _, b = f.partition("|") if f not in col else (f, "", "")
        out[f] = [r[col[a]] if not b else "" if "" in (r[col[a]], r[col[b]]) else f"{r[col[a]]}|{r[col[b]]}"
                  for r in rows]
    return out


def _expected_ids(path, fields, buckets):
    """The row each value must land in: 0 for a missing value, else 1 + blake2b-64 mod (buckets - 1)."""
    from launcher.recipes.wide_deep.tabular import _bucket

    raw = _raw_fields(path, fields)
    return torch.tensor([[0 if v == "" else _bucket(v, buckets) for v in raw[f]] for f in fields],
                        dtype=torch.int32).T


HASHED = [
    {"drop": ["id"], "crosses": [["city", "note"], ["tag", "city"]]},
    {"categorical": ["score"], "continuous": ["tag"], "negative": "no", "test_fraction": 0.3, "seed": 4},
]


@pytest.mark.parametrize("kwargs", HASHED)
def test_hashed_ids_are_each_raw_value_hashed_by_either_reader(tmp_path, reader, kwargs):
    """Each reader (in batches of 50 rows / 2 KiB) gives every row the hash of its own raw value: equal values the
    same row in the train and test splits; typing, continuous columns and labels as with vocabularies."""
    path = _tricky_csv(tmp_path / "odd.csv")
    p = prepare(str(path), "label", "yes", hash_buckets=64, **kwargs)
    vocab = prepare(str(path), "label", "yes", **kwargs)
    assert (p.continuous, p.categorical) == (vocab.continuous, vocab.categorical)
    assert p.field_sizes == [64] * len(p.categorical)
    n = p.train_rows + p.test_rows
    ids = _hashed_by_row(p, n, kwargs.get("test_fraction", 0.2), kwargs.get("seed", 0))
    assert torch.equal(ids, _expected_ids(path, p.categorical, 64))
    assert (ids == 0).any() and (ids[:, 0] != 0).any()  # missing values and crosses with a missing side: row 0
    for a, b in zip((*p.train[::2], *p.test[::2]), (*vocab.train[::2], *vocab.test[::2])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert p.reader == ("pyarrow" if reader == "pyarrow" else "Python's csv module")


@pytest.mark.parametrize("kwargs", [{"drop": ["id"], "crosses": [["city", "note"]]}, {"continuous": ["tag"]}])
def test_the_launcher_pass_counts_the_buckets_the_rank_pass_fills(tmp_path, reader, kwargs):
    """prepare(tensors=False), the launcher's pass, holds no ids: its bucket counts must be those of the ids a
    rank's pass gives (used buckets, missing rows), and its collision counts those of the raw values."""
    path = _tricky_csv(tmp_path / "odd.csv")
    facts = prepare(str(path), "label", "yes", hash_buckets=32, tensors=False, **kwargs)
    rank = prepare(str(path), "label", "yes", hash_buckets=32, **kwargs)
    assert facts.train is None and [c.field for c in facts.collisions] == rank.categorical
    assert (facts.field_sizes, facts.train_rows, facts.test_rows, facts.train_positive, facts.continuous) == \
        (rank.field_sizes, rank.train_rows, rank.test_rows, rank.train_positive, rank.continuous)
    ids = _hashed_by_row(rank, rank.train_rows + rank.test_rows)
    raw = _raw_fields(path, rank.categorical)
    for j, c in enumerate(facts.collisions):
        assert c.used == len(set(ids[:, j].tolist()) - {0}) and c.missing_rows == int((ids[:, j] == 0).sum())
        values = {}  # bucket -> its distinct values
        for v, b in zip(raw[c.field], ids[:, j].tolist()):
            values.setdefault(b, set()).add(v)
        shared = {b for b, vs in values.items() if b and len(vs) > 1}
        assert c.shared == len(shared) and c.shared_rows == sum(int(b in shared) for b in ids[:, j].tolist())
    assert any(c.shared for c in facts.collisions)  # 32 buckets: the test sees collisions


def test_estimated_distinct_values_against_the_exact_count(tmp_path):
    """Linear counting on a field of 5,000 distinct values in 8,191 value buckets (load 0.61: a standard error of
    0.9% of the count, 1.9% of the values that share a bucket): the estimates within 3% and 8% of the exact counts
    (from a Python set); buckets that hold 2+ values and their rows exactly."""
    import random

    from launcher.recipes.wide_deep.tabular import _bucket

    rnd = random.Random(5)
    pool = [f"{rnd.getrandbits(64):016x}" for _ in range(5000)]
    values = pool + [rnd.choice(pool) for _ in range(3000)]
    rnd.shuffle(values)
    path = tmp_path / "ids.csv"
    path.write_text("ad,x,clicked\n" + "".join(f"{v},{i % 7},{'yes' if i % 3 else 'no'}\n"
                                               for i, v in enumerate(values)))
    c, = prepare(str(path), "clicked", "yes", categorical=["ad"], continuous=["x"], hash_buckets=8192,
                 tensors=False).collisions
    buckets = {}
    for v in set(values):
        buckets.setdefault(_bucket(v, 8192), set()).add(v)
    exact_sharing = sum(len(vs) for vs in buckets.values() if len(vs) > 1)
    assert c.used == len(buckets) and c.shared == sum(len(vs) > 1 for vs in buckets.values())
    assert c.shared_rows == sum(len(buckets[_bucket(v, 8192)]) > 1 for v in values)
    assert abs(c.distinct - len(set(values))) <= 0.03 * len(set(values))
    assert abs(c.sharing - exact_sharing) <= 0.08 * exact_sharing


def test_a_full_table_says_so_instead_of_an_estimate():
    from launcher.recipes.wide_deep.tabular import Collisions

    c = Collisions("ad", 16, used=15, shared=15, rows=1000, missing_rows=0, shared_rows=1000)
    assert c.distinct == float("inf") and "every bucket used" in c.line() and "100.0% of rows" in c.line()


def test_hashed_ids_are_the_same_in_another_process(csv_path):
    """blake2b, not Python's salted hash(): another interpreter with another PYTHONHASHSEED gives the same ids."""
    import hashlib
    import os
    import subprocess
    import sys

    kwargs = {"hash_buckets": 1000, "crosses": [["job", "device"]]}
    p = prepare(str(csv_path), "clicked", "yes", **kwargs)
    code = (f"import hashlib; from launcher.recipes.wide_deep.tabular import prepare; "
            f"p = prepare({str(csv_path)!r}, 'clicked', 'yes', **{kwargs!r}); "
            f"print(hashlib.sha256(p.train[1].numpy().tobytes() + p.test[1].numpy().tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == hashlib.sha256(p.train[1].numpy().tobytes() + p.test[1].numpy().tobytes()).hexdigest()


def test_hashed_parquet_reads_as_the_csv(csv_path, tmp_path):
    """The same table as CSV and as Parquet (typed columns, several row groups) gives the same tensors and counts;
    a null is a missing value (row 0), a bool is hashed as its text."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from launcher.recipes.wide_deep.tabular import _bucket

    pq.write_table(pcsv.read_csv(csv_path), tmp_path / "t.parquet", row_group_size=300)
    kwargs = {"hash_buckets": 512, "crosses": [["job", "device"]], "drop": ["user_id"]}
    a, b = prepare(str(csv_path), "clicked", "yes", **kwargs), prepare(str(tmp_path / "t.parquet"), "clicked", "yes",
                                                                        **kwargs)
    assert (a.continuous, a.categorical) == (b.continuous, b.categorical) == (["age", "hours"],
                                                                              ["job", "city", "device", "job|device"])
    for x, y in zip((*a.train, *a.test), (*b.train, *b.test)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    facts = [prepare(str(f), "clicked", "yes", tensors=False, **kwargs).collisions
             for f in (csv_path, tmp_path / "t.parquet")]
    assert facts[0] == facts[1]
    table = pa.table({"tag": ["a", None, "b", ""] * 50, "flag": [True, False, None, True] * 50,
                      "y": [i % 3 == 0 for i in range(200)]})
    pq.write_table(table, tmp_path / "n.parquet", row_group_size=64)
    p = prepare(str(tmp_path / "n.parquet"), "y", "True", hash_buckets=64, test_fraction=0.5)
    expected = torch.tensor([[_bucket("a", 64), _bucket("True", 64)], [0, _bucket("False", 64)],
                             [_bucket("b", 64), 0], [0, _bucket("True", 64)]] * 50, dtype=torch.int32)
    assert torch.equal(_hashed_by_row(p, 200, 0.5), expected)


def _numbers_then_text(path, rows=300, text_at=150):
    cells = [f"{'oops' if i + 1 == text_at else i % 11},k{i % 5},{'yes' if i % 2 else 'no'}\n" for i in range(rows)]
    path.write_text("n,c,clicked\n" + "".join(cells))
    return path


def test_hashed_columns_are_typed_from_their_first_rows(tmp_path, reader, monkeypatch):
    """A column numeric in its first TYPE_ROWS rows is continuous; a non-number after them is refused, naming the
    row and both fixes, each of which then works."""
    from launcher.recipes.wide_deep import tabular

    monkeypatch.setattr(tabular, "TYPE_ROWS", 100)
    path = _numbers_then_text(tmp_path / "f.csv")
    with pytest.raises(TabularError, match=r"column 'n' holds only numbers in its first 100 rows, so "
                                           r"data.hash_buckets typed it continuous, but data row 150 holds 'oops'\. "
                                           r"Set data.categorical=\[n\] to hash it, or data.continuous=\[n\]"):
        prepare(str(path), "clicked", "yes", hash_buckets=16, tensors=False)
    p = prepare(str(path), "clicked", "yes", hash_buckets=16, categorical=["n"])
    assert p.categorical == ["n", "c"] and p.continuous == []
    p = prepare(str(path), "clicked", "yes", hash_buckets=16, continuous=["n"])
    assert p.continuous == ["n"] and not torch.isnan(p.train[0]).any()  # "oops" read as missing: the train mean
    monkeypatch.setattr(tabular, "TYPE_ROWS", 200)  # the text inside the first rows: categorical, as vocabularies say
    assert prepare(str(path), "clicked", "yes", hash_buckets=16).categorical == ["n", "c"]


def test_hashing_holds_no_dictionary_of_a_whole_column(csv_path, reader, monkeypatch):
    """Neither pass gathers a column's values across batches (read_table, or the unifying of batch dictionaries)."""
    from launcher.recipes.wide_deep import _tabular_read, tabular

    def whole_column(*args, **kwargs):
        raise AssertionError("a whole column's dictionary was built")

    monkeypatch.setattr(tabular, "read_table", whole_column)
    monkeypatch.setattr(_tabular_read, "_unified", whole_column)
    for tensors in (False, True):
        prepare(str(csv_path), "clicked", "yes", hash_buckets=100, crosses=[["job", "city"]], tensors=tensors)


@pytest.mark.parametrize("kwargs, message", [
    ({"hash_buckets": 1}, r"data.hash_buckets=1 must be between 2 and 2,147,483,647 rows per field .* Set e\.g\. "
                          r"data.hash_buckets=1000000"),
    ({"hash_buckets": -5}, r"data.hash_buckets=-5 must be between 2"),
    ({"hash_buckets": 2**31}, r"data.hash_buckets=2147483648 must be between 2 and 2,147,483,647"),
    ({"hash_buckets": 1.5}, r"data.hash_buckets=1.5 is not a whole number of rows\. Set e\.g\. data.hash_buckets="),
    ({"hash_buckets": "8"}, r"data.hash_buckets='8' is not a whole number"),
    ({"hash_buckets": True}, r"data.hash_buckets=True is not a whole number"),
    ({"hash_buckets": 1000, "max_vocab": 50}, r"data.max_vocab=50 does nothing with data.hash_buckets=1000: .* "
                                              r"Remove data.max_vocab, or set data.hash_buckets=0"),
])
def test_bad_hash_buckets_are_refused_with_a_fix(csv_path, kwargs, message):
    with pytest.raises(TabularError, match=message):
        prepare(str(csv_path), "clicked", "yes", **kwargs)
    with pytest.raises(TabularError, match=message):  # before the file is looked at: with a missing one too
        prepare("missing.csv", "clicked", "yes", **kwargs)


def test_cli_refuses_bad_hash_buckets_and_shows_collisions(csv_path, tmp_path, monkeypatch, capsys):
    assert _cli(tmp_path, monkeypatch, csv_path, "data.hash_buckets=1") == 2
    assert "data.hash_buckets=1 must be between 2" in " ".join(capsys.readouterr().err.split())
    assert _cli(tmp_path, monkeypatch, csv_path, "data.hash_buckets=abc") == 2
    assert "data.hash_buckets=abc" in capsys.readouterr().err
    assert not (tmp_path / "log_output").exists()
    assert _cli(tmp_path, monkeypatch, csv_path, "data.hash_buckets=64", "data.drop=[user_id]") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "categorical ['job', 'city', 'device'] hashed into 64 rows each (row 0: a missing value)" in out
    assert "data.hash_buckets=64: hash collisions of 3 field(s) over the file's 2,000 rows, worst first" in out
    assert "city: " in out and "of rows in a shared bucket" in out and "estimated ~" in out


def test_a_rank_keeps_what_the_launcher_sized_with_hash_buckets(csv_path):
    from launcher.recipes.wide_deep import RECIPE, TabularDataConfig

    config = TabularDataConfig(path=str(csv_path), label="clicked", positive="yes", hash_buckets=300,
                               crosses=[["job", "city"]])
    facts = RECIPE.data_facts(config)
    rank = TabularCTR(**{k: v for k, v in vars(config).items() if k != "_target_"})
    assert facts.model_sizes["field_sizes"] == rank.prepared.field_sizes == [300] * 5
    assert facts.resident_bytes == sum(t.nbytes for t in (*rank.prepared.train, *rank.prepared.test))
    assert facts.lines[1].startswith("data.hash_buckets=300: hash collisions of 5 field(s)")


# A continuous column with inf, -inf or a number float32 cannot hold: standardised it was NaN in every row and both
# ranks stopped with "training diverged" at step 1; refused before anything starts, naming it. NaN stays missing.

def _inf_file(path, rows=400):
    """x: inf at data row 8, -inf at row 301, 1e308 (inf as float32) at row 51; y: NaN (missing) in every 7th row."""
    x = [str(i * 0.5) for i in range(rows)]
    x[7], x[300], x[50] = "inf", "-inf", "1e308"
    lines = [f"{i % 9},{x[i]},{'nan' if i % 7 == 0 else i % 5},{i % 2}\n" for i in range(rows)]
    text = "age,x,y,clicked\n" + "".join(lines)
    if path.suffix == ".parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.table({"age": [i % 9 for i in range(rows)], "x": [float(v) for v in x],
                                "y": [float("nan") if i % 7 == 0 else float(i % 5) for i in range(rows)],
                                "clicked": [i % 2 for i in range(rows)]}), path)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["inf.csv", "inf.parquet"])
@pytest.mark.parametrize("buckets", [0, 64])
@pytest.mark.parametrize("tensors", [False, True], ids=["launcher", "rank"])
def test_a_continuous_column_that_is_not_finite_is_refused_naming_it(tmp_path, name, buckets, tensors):
    path = _inf_file(tmp_path / name)
    with pytest.raises(TabularError) as e:
        prepare(str(path), "clicked", "", categorical=["age"], hash_buckets=buckets, tensors=tensors)
    assert e.value.problems == [
        f"data.path={path}: continuous column 'x' holds 3 value(s) that are not finite numbers (inf, -inf, or beyond "
        f"float32's +-3.4e38), the first inf at data row 8; standardised, the column would be NaN and training would "
        f"diverge at step 1. Clean the column (an empty cell or a null is a missing value: the train mean), or set "
        f"data.categorical=[x] to take its values as categories, or data.drop=[x]."]
    for fix in ({"categorical": ["age", "x"]}, {"drop": ["x"]}):  # the fixes it names; NaN in y: the train mean
        p = prepare(str(path), "clicked", "", **{"categorical": ["age"]} | fix, hash_buckets=buckets)
        assert "y" in p.continuous and torch.isfinite(p.train[0]).all() and torch.isfinite(p.test[0]).all()


def test_cli_refuses_inf_in_a_continuous_column_before_starting(tmp_path, cli):
    _inf_file(tmp_path / "inf.csv")
    res = cli(["recipe=wide_deep", "data=tabular", "data.path=inf.csv", "data.label=clicked",
               "data.categorical=[age]", "batch.global_size=32", "trainer.steps=3"], tmp_path)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "Traceback" not in err, err
    assert "data.path=inf.csv: continuous column 'x' holds 3 value(s) that are not finite numbers" in err
    assert not (tmp_path / "log_output").exists()


@pytest.mark.parametrize("buckets", [0, 64])
def test_a_list_column_as_the_label_is_refused_as_such(tmp_path, buckets):
    """A Parquet list column named as data.label: said as a list column (it was "not a 0/1 label: set data.positive=
    [1, 2]", which a string key then refused)."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"x": [1.0] * 50, "clicked": [[1, 2]] * 50}), tmp_path / "lists.parquet")
    with pytest.raises(TabularError, match=r"data.label=clicked: column 'clicked' holds lists or mappings "
                                           r"\(\[1, 2\]\), not one value a row"):
        prepare(str(tmp_path / "lists.parquet"), "clicked", "", hash_buckets=buckets)
