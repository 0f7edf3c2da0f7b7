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
