"""TorchRec's unsharded modules with their tables in a table store: an EmbeddingBagCollection (pooled, weighted
features too) and an EmbeddingCollection (sequence embeddings) give the same outputs and row gradients after the
swap as before, fed the same KeyedJaggedTensor (one process, no engine); their tables are found by TorchRec's table
names."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.conftest import needs_torchrec  # noqa: E402

needs_torchrec()
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

from launcher.facts.model import model_facts_on_meta  # noqa: E402
from launcher.plan import TablePlan  # noqa: E402
from launcher.tables import TableLookup, build_tables  # noqa: E402


def _plan(name: str, rows: int, dim: int) -> TablePlan:
    return TablePlan(name=name, rows=rows, dim=dim, location="host", optimizer="sgd", lr=0.1, betas=(0.9, 0.999),
                     eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)


def _kjt(weighted: bool) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([2, 0, 3, 1, 1, 2])  # features a, b over 3 samples (an empty bag included)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=g)
    weights = torch.rand(len(values), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=values, lengths=lengths, weights=weights)


class Tower(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.sparse = module

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        out = self.sparse(kjt)
        if isinstance(out, dict):  # EmbeddingCollection: a JaggedTensor per feature
            return torch.cat([out[k].values() for k in sorted(out)])
        return out.values()


def _swap_and_compare(module: nn.Module, tables: dict[str, tuple[int, int]], attr: str, weighted: bool) -> None:
    torch.manual_seed(0)
    model = Tower(module)
    swapped = copy.deepcopy(model)
    paths = {f"sparse.{attr}.{n}": shape for n, shape in tables.items()}
    store = build_tables([swapped], tuple(_plan(p, *s) for p, s in paths.items()), torch.device("cpu"),
                         torch.float32)
    assert all(isinstance(swapped.get_submodule(p), TableLookup) for p in paths)
    kjt = _kjt(weighted)
    want, got = model(kjt), swapped(kjt)
    assert torch.allclose(got, want, atol=1e-6)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(5))
    (want * w).sum().backward()
    (got * w).sum().backward()
    store.collect()
    for path, (rows, dim) in paths.items():
        dense = torch.zeros(rows, dim)
        for names, entries in store._grads.items():
            for r, vs in entries:
                if names == (path,):
                    dense.index_add_(0, r, vs[0])
        assert torch.allclose(dense, model.get_submodule(path).weight.grad, atol=1e-6), path


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_embedding_bag_collection(weighted, pooling):
    if weighted and pooling != PoolingType.SUM:
        pytest.skip("weighted features pool by sum")
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="t_a", embedding_dim=4, num_embeddings=10, feature_names=["a"], pooling=pooling),
        EmbeddingBagConfig(name="t_b", embedding_dim=3, num_embeddings=12, feature_names=["b"], pooling=pooling),
    ], is_weighted=weighted)
    _swap_and_compare(ebc, {"t_a": (10, 4), "t_b": (12, 3)}, "embedding_bags", weighted)


def test_a_table_two_features_share():
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="shared", embedding_dim=4, num_embeddings=10, feature_names=["a", "b"])])
    _swap_and_compare(ebc, {"shared": (10, 4)}, "embedding_bags", False)


def test_embedding_collection():
    ec = EmbeddingCollection(tables=[
        EmbeddingConfig(name="t_a", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
        EmbeddingConfig(name="t_b", embedding_dim=4, num_embeddings=12, feature_names=["b"]),
    ])
    _swap_and_compare(ec, {"t_a": (10, 4), "t_b": (12, 4)}, "embeddings", False)


def test_tables_are_found_by_torchrec_names_on_meta():
    with torch.device("meta"):
        model = Tower(EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="t_a", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
            EmbeddingBagConfig(name="t_b", embedding_dim=3, num_embeddings=12, feature_names=["b"])]))
    facts = model_facts_on_meta(model)
    assert facts.tables == {"sparse.embedding_bags.t_a": (10, 4), "sparse.embedding_bags.t_b": (12, 3)}
    assert dict(facts.aliases) == {"t_a": "sparse.embedding_bags.t_a", "t_b": "sparse.embedding_bags.t_b"}
    assert any("TorchRec EmbeddingBagCollection at sparse" in line for line in facts.lines)


def _ebc_model() -> Tower:
    torch.manual_seed(1)
    return Tower(EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="t_a", embedding_dim=4, num_embeddings=50, feature_names=["a", "c"]),
        EmbeddingBagConfig(name="t_b", embedding_dim=3, num_embeddings=40, feature_names=["b"])]))


@pytest.mark.parametrize("one_id_bags", [False, True])
def test_a_collection_looks_its_tables_up_in_one_call_as_torchrec_does(one_id_bags):
    """The batched forward (lookup.py batch_collections) against TorchRec's own per-feature forward over the same
    store kind: the same outputs, and after 4 steps of the store the same tables; keys in another order than the
    collection's features, empty bags, a table with two features."""
    plans = (_plan("sparse.embedding_bags.t_a", 50, 4), _plan("sparse.embedding_bags.t_b", 40, 3))
    models = [_ebc_model(), _ebc_model()]
    stores = [build_tables([m], plans, torch.device("cpu"), torch.float32) for m in models]
    assert "forward" in vars(models[0].sparse)  # batched
    del models[1].sparse.forward  # TorchRec's own forward, table by table
    g = torch.Generator().manual_seed(4)
    for _ in range(4):
        lengths = torch.ones(9, dtype=torch.int64) if one_id_bags else torch.randint(0, 4, (9,), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["c", "b", "a"], lengths=lengths,
                                                  values=torch.randint(0, 40, (int(lengths.sum()),), generator=g))
        outs = [m(kjt) for m in models]
        assert torch.equal(outs[0], outs[1])
        w = torch.randn(outs[0].shape, generator=g)
        for out, store in zip(outs, stores):
            (out * w).sum().backward()
            store.collect()
            assert store.step()
    for name in ("sparse.embedding_bags.t_a", "sparse.embedding_bags.t_b"):
        torch.testing.assert_close(stores[0].tables[name].weight, stores[1].tables[name].weight, atol=1e-6, rtol=0)
    with torch.no_grad():
        assert torch.equal(models[0](kjt), models[1](kjt))
    bad = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b", "c"], lengths=torch.ones(3, dtype=torch.int64),
                                              values=torch.tensor([3, 45, 2]))
    with pytest.raises(IndexError, match="index 45 is out of bounds for a table of 40 rows"):
        models[0](bad)
