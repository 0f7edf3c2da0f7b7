"""The host tables' C kernels (launcher/tables/kernels.c) against the torch ops they replace, and the Adagrad table
optimizers against torch's Adagrad and FBGEMM's TBE: the same rows, the same optimizer, <= 1e-6 apart."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import launcher.tables.kernels as kernels
from launcher.plan import TablePlan
from launcher.plan.registry import TABLE_OPTIMIZERS, table_state_bytes
from launcher.tables import build_tables
from launcher.tables.row_update import step_all, updates_all, write_rows
from launcher.tables.sparse_optim import LazyAdam, RowwiseAdagrad, SparseAdagrad, SparseAdam, SparseFTRL, SparseSGD

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"the C kernels did not load: {kernels.why_not()}")

ROWS, DIM = 50, 7  # 7: no vector width divides it (the kernels' tails)

OPTIMIZERS = {
    "sgd": lambda w: SparseSGD(w, lr=0.1),
    "momentum_nesterov_decay": lambda w: SparseSGD(w, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "momentum_dampening": lambda w: SparseSGD(w, lr=0.05, momentum=0.5, dampening=0.1),
    "lazy_adam": lambda w: LazyAdam(w, lr=0.01),
    "lazy_adam_l2": lambda w: LazyAdam(w, lr=0.01, weight_decay=0.1, decoupled_decay=False),
    "lazy_adamw": lambda w: LazyAdam(w, lr=0.01, weight_decay=0.1),
    "ftrl": lambda w: SparseFTRL(w, lr=0.1, l1=0.01, l2=0.02),
    "ftrl_power": lambda w: SparseFTRL(w, lr=0.1, lr_power=-0.3, initial_accumulator=0.5),
    "adagrad": lambda w: SparseAdagrad(w, lr=0.1, initial_accumulator=0.1),
    "adagrad_decay": lambda w: SparseAdagrad(w, lr=0.1, weight_decay=0.05),
    "rowwise_adagrad": lambda w: RowwiseAdagrad(w, lr=0.1, initial_accumulator=0.1),
    "rowwise_adagrad_decay": lambda w: RowwiseAdagrad(w, lr=0.1, weight_decay=0.05),
}


def _torch_ops(monkeypatch) -> None:
    """From here on the optimizers take the torch ops (as on a host where the kernels do not build)."""
    monkeypatch.setattr(kernels, "_lib", None)


def _steps(make, steps: int = 4):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(ROWS, DIM, generator=g)
    batches = [(torch.randperm(ROWS, generator=g)[:20], torch.randn(20, DIM, generator=g)) for _ in range(steps)]
    return make(weight), batches


def _state(opt) -> list[torch.Tensor]:
    return [opt.weight.clone(), *[t.clone() for t in opt.state_tensors()]]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizer_steps_as_its_torch_ops(name, monkeypatch):
    fused, batches = _steps(OPTIMIZERS[name])
    for rows, grads in batches:
        fused.step(rows, grads)
    _torch_ops(monkeypatch)
    ref, _ = _steps(OPTIMIZERS[name])
    for rows, grads in batches:
        ref.step(rows, grads)
    for got, want in zip(_state(fused), _state(ref)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert not torch.equal(fused.weight, _steps(OPTIMIZERS[name])[0].weight)  # it moved


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_deferred_updates_are_the_in_place_step_bit_for_bit(name):
    """``updates`` (placement.prefetch writes them later) computes what ``step`` writes."""
    stepped, batches = _steps(OPTIMIZERS[name])
    deferred, _ = _steps(OPTIMIZERS[name])
    for rows, grads in batches:
        stepped.step(rows, grads)
        write_rows(rows, deferred.updates(rows, grads))
    for got, want in zip(_state(deferred), _state(stepped)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_many_tables_stepped_in_one_call_are_each_stepped_alone(threads, monkeypatch):
    """``step_all``: every optimizer's tables (dims 7 and 16, torch's SparseAdam among them), each kernel's in one
    call with their rows split over the threads across tables, write what each table's own step writes, and so do
    ``updates_all``'s deferred values (placement.prefetch's) once written; a row out of range in one table is refused
    before any table of that call is written or any step count moves."""
    monkeypatch.setattr(kernels, "threads", lambda: threads)
    g = torch.Generator().manual_seed(3)
    makers = [*OPTIMIZERS.values(), lambda w: SparseAdam(w, lr=0.01)]
    shapes = [(400, DIM if i % 2 else 16) for i in range(len(makers))]
    starts = [torch.randn(*s, generator=g) for s in shapes]
    alone = [make(w.clone()) for make, w in zip(makers, starts)]
    together = [make(w.clone()) for make, w in zip(makers, starts)]
    deferred = [make(w.clone()) for make, w in zip(makers[:-1], starts)]  # (torch's SparseAdam writes its own step)
    for _ in range(3):
        batch = [(torch.randperm(400, generator=g)[:150], torch.randn(150, d, generator=g)) for _, d in shapes]
        for opt, (rows, grads) in zip(alone, batch):
            opt.step(rows, grads)
        step_all([(opt, rows, grads) for opt, (rows, grads) in zip(together, batch)])
        news = updates_all([(opt, rows, grads) for opt, (rows, grads) in zip(deferred, batch)])
        assert len(news) == len(deferred)
        for (rows, _), new in zip(batch, news):
            write_rows(rows, new)
    for a, b in zip(alone, together):
        for got, want in zip(_state(b), _state(a)):
            assert torch.equal(got, want)
    for a, b in zip(alone, deferred):
        for got, want in zip(_state(b), _state(a)):
            assert torch.equal(got, want)
        assert getattr(b, "steps", None) == getattr(a, "steps", None)
    before, counts = [_state(opt) for opt in together[:4]], [opt.steps for opt in together[:4]]  # SGDs, lazy Adam
    bad = [(opt, torch.tensor([1, 2, 400 if i == 2 else 3]), torch.ones(3, d))
           for i, (opt, (_, d)) in enumerate(zip(together[:4], shapes))]
    with pytest.raises(IndexError, match="index 400 is out of bounds for a table of 400 rows"):
        step_all(bad)
    with pytest.raises(IndexError, match="index 400 is out of bounds for a table of 400 rows"):
        updates_all(bad)
    for opt, was in zip(together[:4], before):
        assert all(torch.equal(x, y) for x, y in zip(_state(opt), was))
    assert [opt.steps for opt in together[:4]] == counts  # a refused step moves no step count either


def test_adagrad_is_torchs_when_every_row_steps():
    torch.manual_seed(0)
    start = torch.randn(ROWS, DIM)
    ref = nn.Parameter(start.clone())
    opt = torch.optim.Adagrad([ref], lr=0.1, eps=1e-10, initial_accumulator_value=0.1, weight_decay=0.01)
    ours = SparseAdagrad(start.clone(), lr=0.1, eps=1e-10, initial_accumulator=0.1, weight_decay=0.01)
    for _ in range(4):
        grad = torch.randn(ROWS, DIM)
        ref.grad = grad.clone()
        opt.step()
        ours.step(torch.arange(ROWS), grad)
    torch.testing.assert_close(ours.weight, ref.detach(), atol=1e-6, rtol=0)


def test_coalesce_sums_each_row_in_index_order_and_refuses_an_id_out_of_range():
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 30, (500,), generator=g)
    values = torch.randn(500, DIM, generator=g)
    unique, sums = kernels.coalesce(rows, values, 30)
    want_rows, inverse = torch.unique(rows, return_inverse=True)
    want = torch.zeros(len(want_rows), DIM).index_add_(0, inverse, values)
    assert torch.equal(unique, want_rows) and torch.equal(sums, want)  # sorted rows, index_add_'s sums
    big = torch.tensor([(1 << 40) + 5, 7, (1 << 40) + 5, 1 << 33, 7])  # rows past 32 bits sort too
    unique, sums = kernels.coalesce(big, torch.arange(5.0).unsqueeze(1).expand(5, DIM).contiguous(), 1 << 62)
    assert unique.tolist() == [7, 1 << 33, (1 << 40) + 5] and sums[:, 0].tolist() == [5.0, 3.0, 2.0]
    with pytest.raises(IndexError, match="index 30 is out of bounds"):
        kernels.coalesce(torch.tensor([1, 30]), torch.ones(2, DIM), 30)


def test_coalesce_many_is_each_coalesce_over_threads(monkeypatch):
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(400, 3 * DIM, generator=g)
    parts = [(torch.randint(0, 30, (n,), generator=g), torch.randn(n, DIM, generator=g)) for n in (0, 1, 257, 400)]
    parts.append((torch.randint(0, 30, (400,), generator=g), wide[:, DIM:2 * DIM]))  # a column slice, read in place
    monkeypatch.setattr(kernels, "threads", lambda: 2)
    for (u, s), (rows, values) in zip(kernels.coalesce_many(parts, 30), parts):
        want_u, want_s = kernels.coalesce(rows, values.contiguous(), 30)
        assert torch.equal(u, want_u) and torch.equal(s, want_s)
    with pytest.raises(IndexError, match="index 31 is out of bounds"):
        kernels.coalesce_many([parts[2], (torch.tensor([3, 31]), torch.ones(2, DIM))], 30)


@pytest.mark.parametrize("dims", [(DIM,) * 6, (DIM, 3, 16, DIM, 1, 5)])
def test_sums_in_several_blocks_are_each_parts_own_coalesce(dims, monkeypatch):
    """The coalesce's sums go into blocks kept under glibc's mmap threshold (kernels._sum_blocks; here 8 KiB less
    its slack, so that small parts fill several): parts split between blocks, one larger than a block, an empty
    one, each part's rows and sums still those of its own coalesce, bit for bit, with equal widths (one split a
    block) or not."""
    g = torch.Generator().manual_seed(4)
    sizes = (40, 0, 70, 300, 20, 33)
    parts = [(torch.randint(0, 50, (n,), generator=g), torch.randn(n, d, generator=g)) for n, d in zip(sizes, dims)]
    monkeypatch.setattr(kernels, "MMAP_MAX", 8192)
    blocks = kernels._sum_blocks([n * d for n, d in zip(sizes, dims)])
    firsts, ends = [b[1] for b in blocks], [b[2] for b in blocks]
    assert len(blocks) >= 3 and firsts == [0, *ends[:-1]] and ends[-1] == len(sizes)
    assert all(b[0].numel() * 4 < 8192 - kernels.BLOCK_SLACK for b in blocks if b[2] - b[1] > 1)  # or a part alone
    for (u, s), (rows, values) in zip(kernels.coalesce_many(parts, 50), parts):
        want_u, inverse = torch.unique(rows, return_inverse=True)
        assert torch.equal(u, want_u)
        assert torch.equal(s, torch.zeros(len(want_u), values.shape[1]).index_add_(0, inverse, values))


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_one_big_lookup_split_over_the_threads_is_the_one_thread_coalesce(threads, monkeypatch):
    """Fewer lookups than threads: a lookup of 2^14 ids or more is split over the threads by its ids' top bits
    (kernels.c coalesce_split). Skewed ids (most in one range: ranges of other threads empty), ids past 32 bits, a
    column slice: the rows and sums of index_add_ in index order, bit for bit; an id out of range still named."""
    g = torch.Generator().manual_seed(2)
    n = 40_000
    skewed = (torch.pow(1e6, torch.rand(n, generator=g)).long() - 1)  # wide_deep's log-uniform ids
    past_32_bits = torch.randint(0, 1 << 40, (n,), generator=g)
    few = torch.randint(0, 3, (n,), generator=g)  # under the split's first 11 bits: one range holds them all
    values = torch.randn(n, 3 * DIM, generator=g)[:, DIM:2 * DIM]
    monkeypatch.setattr(kernels, "threads", lambda: threads)
    for rows in (skewed, past_32_bits, few):
        (unique, sums), = kernels.coalesce_many([(rows, values)], 1 << 62)
        want_rows, inverse = torch.unique(rows, return_inverse=True)
        assert torch.equal(unique, want_rows)
        assert torch.equal(sums, torch.zeros(len(want_rows), DIM).index_add_(0, inverse, values.contiguous()))
    bad = skewed.clone()
    bad[30_000] = 10 ** 6
    with pytest.raises(IndexError, match="index 1000000 is out of bounds"):
        kernels.coalesce_many([(bad, values)], 10 ** 6)


@pytest.mark.parametrize("n", [300, 40_000])  # one thread a run; a run split over the threads
def test_tables_looked_up_with_one_ids_tensor_are_sorted_once_each_its_own_sums(n, monkeypatch):
    """Consecutive parts with the same rows tensor (Wide&Deep's two tables) are one run of the kernel (one sort):
    each part still gets its own rows and sums, bit for bit those of its own coalesce, columns slices included."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 1000, (n,), generator=g)
    other = rows.clone()  # equal ids in another tensor: a run of its own
    wide = torch.randn(n, 17, generator=g)
    parts = [(rows, wide[:, :16]), (rows, wide[:, 16:]), (other, torch.randn(n, 2, generator=g)),
             (rows, torch.randn(n, DIM, generator=g))]
    monkeypatch.setattr(kernels, "threads", lambda: 2)
    for (u, s), (r, values) in zip(kernels.coalesce_many(parts, 1000), parts):
        want_u, inverse = torch.unique(r, return_inverse=True)
        assert torch.equal(u, want_u)
        assert torch.equal(s, torch.zeros(len(want_u), values.shape[1]).index_add_(0, inverse, values.contiguous()))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [300, 40_000])
@pytest.mark.parametrize("runs", ["several", "one"])  # runs spread over the threads; at 40,000 ids, one run split
def test_the_coalesce_says_which_parts_sums_are_not_all_finite(runs, n, threads, monkeypatch):
    """``coalesce_checked``: the finiteness check a step makes of its gradients, made by the coalesce on the sums it
    wrote, part by part (parts sharing one ids tensor too), in any thread's share of a split run: a nan, an inf, and
    finite values whose sum overflows are found where they are, and nowhere else; the sums are coalesce_many's."""
    g = torch.Generator().manual_seed(4)
    rows = torch.randint(0, 5000, (n,), generator=g)
    wide = torch.randn(n, 2 * DIM, generator=g)
    parts = [(rows, wide[:, :DIM]), (rows, wide[:, DIM:]), (rows.clone(), torch.randn(n, 3, generator=g)),
             (torch.randint(0, 5000, (n,), generator=g), torch.randn(n, DIM, generator=g))]
    parts = parts if runs == "several" else parts[:2]
    monkeypatch.setattr(kernels, "threads", lambda: threads)
    sums, finite = kernels.coalesce_checked(parts, 5000)
    assert finite == [True] * len(parts)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(sums, kernels.coalesce_many(parts, 5000)))
    order = torch.argsort(rows)
    values, counts = torch.unique(rows, return_counts=True)
    twice = (rows == values[counts > 1][-1]).nonzero().flatten()[:2]  # two ids of one row, high in the order
    cases = [(1, order[-1], float("nan")), (0, order[0], float("-inf")), (len(parts) - 1, n // 2, float("inf")),
             (0, twice, 3e38)]  # the last: two finite values whose sum is not
    if runs == "several":  # parts 2 and 3 each a run of one array (kernels.c sum_sorted_one): its first and last rows
        cases += [(2, order[-1], float("nan")), (3, torch.argsort(parts[3][0])[0], float("inf"))]
    for part, at, bad in cases:
        broken = [(r, v.clone()) for r, v in parts]
        broken[part][1][at, 1] = bad
        assert torch.isfinite(broken[part][1]).all() == (bad == 3e38)
        _, finite = kernels.coalesce_checked(broken, 5000)
        assert finite == [p != part for p in range(len(parts))], (part, at, bad, finite)


def test_gather_is_index_select_and_refuses_an_id_out_of_range():
    table = torch.randn(ROWS, DIM)
    rows = torch.randint(0, ROWS, (300,))
    assert torch.equal(kernels.gather(table, rows), torch.index_select(table, 0, rows))
    with pytest.raises(IndexError):
        kernels.gather(table, torch.tensor([0, -1]))
    assert kernels.all_finite([table]) and not kernels.all_finite([torch.tensor([1.0, float("nan")])])


@pytest.mark.parametrize("threads", [1, 2])
def test_all_finite_finds_one_bad_value_in_any_tensor_and_chunk(threads, monkeypatch):
    monkeypatch.setattr(kernels, "threads", lambda: threads)
    tensors = [torch.zeros(n) for n in (5, (1 << 16) * 3 + 7, 1 << 16, 3)] + [torch.zeros(4, dtype=torch.float64)]
    assert kernels.all_finite(tensors) and kernels.all_finite([])
    for t in range(len(tensors)):
        for at in {0, tensors[t].numel() // 2, tensors[t].numel() - 1}:
            for bad in (float("nan"), float("inf"), -float("inf")):
                tensors[t][at] = bad
                assert not kernels.all_finite(tensors), (t, at, bad)
                tensors[t][at] = 0.0


def test_rowwise_adagrad_keeps_one_state_a_row_and_the_planner_counts_it():
    opt = RowwiseAdagrad(torch.zeros(ROWS, DIM), lr=0.1)
    assert [t.shape for t in opt.state_tensors()] == [torch.Size([ROWS])]
    assert table_state_bytes("rowwise_adagrad", ROWS, DIM) == 4 * ROWS
    assert table_state_bytes("adagrad", ROWS, DIM) == 4 * ROWS * DIM
    assert TABLE_OPTIMIZERS["adagrad"].sparse and TABLE_OPTIMIZERS["rowwise_adagrad"].shardable


@pytest.mark.parametrize("dim,decay,threads", [(7, 0.0, 1), (64, 0.05, 2), (16, 0.0, 3)])
def test_rowwise_adagrad_over_several_passes_of_rows_steps_as_its_torch_ops(dim, decay, threads, monkeypatch):
    """The row-wise kernel takes rows 128 at a time (kernels.c adagrad_rows_d): 300 rows a step over 1-3 threads, a
    pass cut at every thread's share and a partial last one, against the torch ops; deferred values bit for bit."""
    monkeypatch.setattr(kernels, "threads", lambda: threads)
    g = torch.Generator().manual_seed(5)
    start = torch.randn(1000, dim, generator=g)
    batches = [(torch.randperm(1000, generator=g)[:300], torch.randn(300, dim, generator=g)) for _ in range(3)]
    fused, deferred = (RowwiseAdagrad(start.clone(), lr=0.1, weight_decay=decay) for _ in range(2))
    for rows, grads in batches:
        fused.step(rows, grads)
        write_rows(rows, deferred.updates(rows, grads))
    assert all(torch.equal(a, b) for a, b in zip(_state(deferred), _state(fused)))
    _torch_ops(monkeypatch)
    ref = RowwiseAdagrad(start.clone(), lr=0.1, weight_decay=decay)
    for rows, grads in batches:
        ref.step(rows, grads)
    for got, want in zip(_state(fused), _state(ref)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_a_host_without_a_compiler_takes_the_torch_ops(monkeypatch):
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setattr(kernels, "_tried", False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CC", raising=False)
    assert not kernels.available() and kernels.kernel_name().startswith("torch (no C compiler")
    opt = SparseSGD(torch.zeros(4, 2), lr=1.0)
    opt.step(torch.tensor([1]), torch.ones(1, 2))
    assert opt.weight[1].tolist() == [-1.0, -1.0]
    monkeypatch.setattr(kernels, "_tried", False)
    monkeypatch.setenv("HL_TABLE_KERNELS", "torch")
    assert not kernels.available() and kernels.why_not() == "HL_TABLE_KERNELS=torch"


def _plan(optimizer: str, rows: int, dim: int, name: str) -> TablePlan:
    return TablePlan(name=name, rows=rows, dim=dim, location="host", optimizer=optimizer, lr=0.05,
                     betas=(0.9, 0.999), eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)


@pytest.mark.parametrize("optimizer, fbgemm_name", [("sgd", "EXACT_SGD"), ("adagrad", "EXACT_ADAGRAD"),
                                                     ("rowwise_adagrad", "EXACT_ROWWISE_ADAGRAD")])
def test_host_tables_train_as_fbgemms_tbe(optimizer, fbgemm_name):
    """Three nn.EmbeddingBag tables (1-id and 3-id bags, sum) trained through the host store equal FBGEMM's CPU
    table-batched embedding with the same optimizer, starting weights and accumulators."""
    tbe_mod = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training",
                                  reason="fbgemm-gpu-cpu is not installed (the test extra brings it on x86-64 Linux)")
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

    rows, dim, batch, bag = 40, 8, 16, 3
    torch.manual_seed(0)
    model = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(3))
    tbe = tbe_mod.SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, tbe_mod.ComputeDevice.CPU)] * 3,
        optimizer=getattr(EmbOptimType, fbgemm_name), learning_rate=0.05, eps=1e-8)
    for t, (w, m) in enumerate(zip(tbe.split_embedding_weights(), model)):
        w.copy_(m.weight.detach())
    if optimizer != "sgd":
        for states in tbe.split_optimizer_states():
            states[0].fill_(0.1)
    ours = copy.deepcopy(model)
    build_tables([ours], tuple(_plan(optimizer, rows, dim, str(t)) for t in range(3)), torch.device("cpu"),
                 torch.float32)
    store = ours[0]._tables[0]
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        ids = torch.randint(0, rows, (3, batch, bag), generator=g)
        up = torch.randn(batch, 3 * dim, generator=g)
        out = torch.cat([ours[t](ids[t]) for t in range(3)], dim=1)
        out.backward(up)
        store.collect()
        assert store.step()
        offsets = torch.arange(0, 3 * batch * bag + 1, bag)
        tbe(ids.reshape(-1), offsets).backward(up)
    for t, w in enumerate(tbe.split_embedding_weights()):
        torch.testing.assert_close(store.tables[str(t)].weight, w, atol=1e-6, rtol=1e-5)
