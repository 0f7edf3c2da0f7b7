"""Every way a model calls an nn.Embedding / nn.EmbeddingBag works on the lookup that replaces it: positional and
keyword arguments (torch's own names: TorchRec calls ``input=``, ``offsets=``, ``per_sample_weights=``), 1-D input
with offsets (with and without ``include_last_offset``) and 2-D bags, modes sum/mean/max, per-sample weights,
``padding_idx``, int32 ids, empty bags. Each call is made on the original module and on the swapped one; outputs and
the row gradients the store collects must match torch's, and a call torch refuses is refused alike."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from launcher.plan import TablePlan
from launcher.tables import build_tables
from launcher.tables.hashing import IdHash, mix64

ROWS, DIM = 12, 3


def _plan(name: str, hash_buckets: int = 0, hash_fn: str = "mix") -> TablePlan:
    return TablePlan(name=name, rows=ROWS, dim=DIM, location="host", optimizer="sgd", lr=0.1, betas=(0.9, 0.999),
                     eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1, hash_buckets=hash_buckets,
                     hash_fn=hash_fn)


def _swapped(module: nn.Module, **plan):
    """(the original in a holder, a copy whose table is swapped, the copy's store)."""
    torch.manual_seed(0)
    holder = nn.ModuleDict({"t": module})
    swapped = copy.deepcopy(holder)
    store = build_tables([swapped], (_plan("t", **plan),), torch.device("cpu"), torch.float32)
    return holder, swapped, store


def _row_grad(store) -> torch.Tensor:
    """The dense (rows, dim) gradient of the store's collected rows (summed per row)."""
    store.collect()
    dense = torch.zeros(ROWS, DIM)
    for entries in store._grads.values():
        for rows, (values,) in entries:  # one table a group here
            dense.index_add_(0, rows, values)
    store.discard()
    return dense


def _compare(module: nn.Module, args: tuple, kwargs: dict) -> None:
    holder, swapped, store = _swapped(module)
    want = holder["t"](*args, **kwargs)
    got = swapped["t"](*args, **kwargs)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)
    weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    (want * weights).sum().backward()
    (got * weights).sum().backward()
    assert torch.allclose(_row_grad(store), holder["t"].weight.grad, atol=1e-6)


IDS = torch.tensor([3, 0, 7, 7, 11, 2, 0, 5])
OFFSETS = torch.tensor([0, 2, 2, 5])  # bag 1 is empty
PSW = torch.linspace(0.5, 2.0, 8)


@pytest.mark.parametrize("call", ["positional", "keyword", "int32", "2d", "3d"])
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_calls(call, padding_idx):
    ids = {"int32": IDS.int(), "2d": IDS.view(2, 4), "3d": IDS.view(2, 2, 2)}.get(call, IDS)
    kwargs = {"input": ids} if call == "keyword" else {}
    _compare(nn.Embedding(ROWS, DIM, padding_idx=padding_idx), () if kwargs else (ids,), kwargs)


BAG_CALLS = {
    "positional": lambda: ((IDS, OFFSETS), {}),
    "keyword": lambda: ((), {"input": IDS, "offsets": OFFSETS}),
    "torchrec": lambda: ((), {"input": IDS, "offsets": torch.cat([OFFSETS, torch.tensor([8])]),
                              "per_sample_weights": None}),  # include_last_offset=True, as TorchRec builds them
    "weights": lambda: ((IDS, OFFSETS), {"per_sample_weights": PSW}),
    "weights_positional": lambda: ((IDS, OFFSETS, PSW), {}),
    "2d": lambda: ((IDS.view(2, 4),), {}),
    "2d_weights": lambda: ((IDS.view(2, 4),), {"per_sample_weights": PSW.view(2, 4)}),
    "int32": lambda: ((IDS.int(), OFFSETS.int()), {}),
}


@pytest.mark.parametrize("call", list(BAG_CALLS))
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_bag_calls(call, mode, padding_idx):
    args, kwargs = BAG_CALLS[call]()
    weighted = "weights" in call
    if weighted and mode != "sum":
        pytest.skip("per_sample_weights needs mode sum (the refusal is tested below)")
    last = call == "torchrec"
    _compare(nn.EmbeddingBag(ROWS, DIM, mode=mode, padding_idx=padding_idx, include_last_offset=last), args, kwargs)


@pytest.mark.parametrize("module, args, kwargs", [
    (nn.EmbeddingBag(ROWS, DIM), (IDS.view(2, 4), torch.tensor([0, 1])), {}),  # 2-D input with offsets
    (nn.EmbeddingBag(ROWS, DIM), (IDS,), {}),  # 1-D input without offsets
    (nn.EmbeddingBag(ROWS, DIM, mode="mean"), (IDS, OFFSETS), {"per_sample_weights": PSW}),  # weights need sum
    (nn.EmbeddingBag(ROWS, DIM), (IDS, OFFSETS), {"per_sample_weights": PSW[:3]}),  # weights of another shape
    (nn.Embedding(ROWS, DIM), (IDS, OFFSETS), {}),  # nn.Embedding takes no offsets
    (nn.Embedding(ROWS, DIM), (), {"ids": IDS}),  # not torch's argument name
])
def test_calls_torch_refuses_are_refused_alike(module, args, kwargs):
    holder, swapped, _ = _swapped(module)
    with pytest.raises(Exception) as want:
        holder["t"](*args, **kwargs)
    with pytest.raises(type(want.value)):
        swapped["t"](*args, **kwargs)


def test_the_lookup_keeps_the_modules_attributes():
    _, swapped, _ = _swapped(nn.EmbeddingBag(ROWS, DIM, mode="max", padding_idx=2, include_last_offset=True))
    t = swapped["t"]
    assert (t.num_embeddings, t.embedding_dim, t.mode, t.padding_idx, t.include_last_offset) == (ROWS, DIM, "max", 2,
                                                                                                 True)


def _reference_mix(x: int) -> int:
    """splitmix64's finaliser in Python's unbounded ints (the C original, modulo 2^64)."""
    m = (1 << 64) - 1
    x &= m
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & m
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


RAW = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), 9_000_000_000_000_000_007, 123456789, 42], dtype=torch.int64)


def test_mix64_is_splitmix64():
    assert [v & ((1 << 64) - 1) for v in mix64(RAW).tolist()] == [_reference_mix(x) for x in RAW.tolist()]


@pytest.mark.parametrize("fn", ["mix", "mod"])
def test_raw_ids_are_hashed_into_rows(fn):
    rows = IdHash(ROWS, fn)(RAW)
    assert rows.min() >= 0 and rows.max() < ROWS
    want = [(_reference_mix(x) if fn == "mix" else x & ((1 << 64) - 1)) for x in RAW.tolist()]
    if fn == "mod":  # Python's remainder of the signed id
        want = [x % ROWS for x in RAW.tolist()]
    else:  # the remainder of the signed int64 the mixer leaves
        want = [(w - (1 << 64) if w >= 1 << 63 else w) % ROWS for w in want]
    assert rows.tolist() == want


def test_padding_stays_padding_and_no_other_id_lands_there():
    h = IdHash(ROWS, "mix", padding_idx=0)
    ids = torch.arange(-5000, 5000)
    rows = h(ids)
    assert rows[ids == 0].tolist() == [0] and bool((rows[ids != 0] != 0).all()) and rows.max() < ROWS


@pytest.mark.parametrize("bag", [False, True])
def test_a_hashed_table_looks_up_raw_ids_as_the_model_on_hashed_rows(bag):
    module = nn.EmbeddingBag(ROWS, DIM, mode="sum") if bag else nn.Embedding(ROWS, DIM)
    holder, swapped, store = _swapped(module, hash_buckets=10)
    rows = IdHash(10, "mix")(RAW)
    args = (RAW, torch.tensor([0, 3, 5])) if bag else (RAW,)
    want = holder["t"](rows, *args[1:])
    got = swapped["t"](*args)
    assert torch.allclose(got, want)
    got.sum().backward()
    want.sum().backward()
    assert torch.allclose(_row_grad(store), holder["t"].weight.grad, atol=1e-6)
    stats = swapped["t"].hash_stats.to_dict()
    assert (stats["ids"], stats["distinct_ids_per_batch"], stats["rows_per_batch"]) == (
        len(RAW), len(set(RAW.tolist())), len(set(rows.tolist())))
    assert stats["collided"] == len(set(RAW.tolist())) - len(set(rows.tolist()))
