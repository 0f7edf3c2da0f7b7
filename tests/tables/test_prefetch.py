"""Host-table prefetch (placement.prefetch): the rows of the next micro-batches are gathered on a background thread
and the update of step t writes first the rows they need; the proof that nothing is served stale is that every loss,
table row and optimizer state equals the serial path's bit for bit, over enough steps on tables so small that most
rows of one micro-batch are looked up again by the next (one process; 2 launched ranks: tests/integration/
test_prefetch_runs.py)."""

import pytest
import torch
from torch import nn

from launcher.plan import TablePlan
from launcher.recipes.wide_deep.data import SyntheticCTR
from launcher.recipes.wide_deep.model import WideDeep
from launcher.tables import build_tables
from launcher.tables.record import Lookahead, record_lookups
from launcher.tables.transfer import PinnedRing, gather_to_device

CPU = torch.device("cpu")
OPTIMIZERS = {"lazy_adam": dict(lr=0.05), "ftrl": dict(lr=0.1, l1=1e-3, l2=1e-3), "sgd": dict(lr=0.1),
              "momentum": dict(lr=0.1, momentum=0.9), "sparse_adam": dict(lr=0.05), "adagrad": dict(lr=0.1),
              "rowwise_adagrad": dict(lr=0.1)}


def _plan(name: str, rows: int, dim: int, optimizer: str) -> TablePlan:
    kw = {"betas": (0.9, 0.999), "eps": 1e-8, "l1": 0.0, "l2": 0.0, "lr_power": -0.5, "initial_accumulator": 0.1,
          **OPTIMIZERS[optimizer]}
    return TablePlan(name=name, rows=rows, dim=dim, location="host", optimizer=optimizer, **kw)


def _wide_deep(deep: str, wide: str):
    torch.manual_seed(0)
    model = WideDeep(13, 26, 8, 4, [8])  # 208 rows per table; 16 samples x 26 fields look most of them up
    plans = (_plan("deep_embedding", 208, 4, deep), _plan("wide_embedding", 208, 1, wide))
    return model, build_tables([model], plans, CPU, torch.float32)


def _batches(seed: int = 7):
    return SyntheticCTR(13, 26, 8, 0).train_batches(0, 1, 16, seed)


def _train(model, store, depth: int, steps: int = 24, accum: int = 1, batches=None, before=None, evaluate=None):
    """A trainer's loop in small: each micro-batch forward, backward, collect; the dense and table steps."""
    batches = batches or _batches()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ahead = Lookahead(store, depth, CPU, torch.float32, accum) if depth and store.start_prefetch() else None
    losses, evals = [], []
    for step in range(steps):
        total = 0.0
        for _ in range(accum):
            if before is not None:
                before(step)
            batch = next(batches) if ahead is None else ahead.take(lambda: next(batches), lambda b: model(*b[0]))[0]
            (dense, ids), labels = batch
            loss = nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels) / accum
            loss.backward()
            store.collect()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        store.step()
        losses.append(total)
        if evaluate is not None and step % 5 == 4:
            with torch.no_grad():
                evals.append(evaluate(model))
    return losses, evals, ahead


def _same_state(a, b):
    torch.testing.assert_close(a.state_dict(), b.state_dict(), rtol=0, atol=0)  # weights and optimizer states


@pytest.mark.parametrize("deep,wide,depth,accum", [("lazy_adam", "ftrl", 1, 1), ("lazy_adam", "ftrl", 2, 2),
                                                    ("momentum", "sgd", 1, 2), ("sparse_adam", "ftrl", 3, 1),
                                                    ("adagrad", "rowwise_adagrad", 2, 1)])
def test_prefetch_gives_the_serial_losses_tables_and_states_bit_for_bit(deep, wide, depth, accum):
    held_out = next(SyntheticCTR(13, 26, 8, 0).train_batches(0, 1, 64, 99))[0]
    runs = []
    for d in (0, depth):
        model, store = _wide_deep(deep, wide)
        losses, evals, ahead = _train(model, store, d, accum=accum, evaluate=lambda m: m(*held_out))
        runs.append((losses, evals, model, store, ahead))
    (serial, serial_evals, _, serial_store, _), (losses, evals, model, store, ahead) = runs
    assert losses == serial
    assert all(torch.equal(a, b) for a, b in zip(evals, serial_evals))
    _same_state(store, serial_store)
    stats = store.prefetch_stats()
    assert stats["served"] == 2 * len(losses) * accum and stats["missed"] == 0  # both tables, every micro-batch
    if deep != "sparse_adam":  # it has no two-part write: every touched row is written at once, then re-gathered
        assert stats["urgent_rows"] > 0 and stats["deferred_rows"] > 0  # rows did repeat, and some waited


class Shifted(nn.Module):
    """Looks its tables up with ids shifted by an attribute the loop changes between recording and forward, behind a
    dropout and through an nn.EmbeddingBag with padding."""

    def __init__(self):
        super().__init__()
        self.shift = 0
        self.drop = nn.Dropout(0.5)
        self.emb = nn.Embedding(30, 3, padding_idx=0)
        self.bag = nn.EmbeddingBag(30, 2, mode="mean", padding_idx=0)
        self.head = nn.Linear(4 + 3 + 2, 1)

    def forward(self, dense, ids):
        ids = (ids + self.shift) % 30
        parts = [self.drop(dense), self.emb(ids).sum(1), self.bag(ids)]
        return self.head(torch.cat(parts, dim=1)).squeeze(-1)


def _shifted_batches():
    g = torch.Generator().manual_seed(3)
    while True:
        yield (torch.randn(8, 4, generator=g), torch.randint(0, 30, (8, 5), generator=g)), torch.rand(8, generator=g)


@pytest.mark.parametrize("changes", [False, True])
def test_recorded_ids_are_checked_and_a_dropout_before_the_lookups_draws_the_same(changes):
    runs = []
    for depth in (0, 1):
        torch.manual_seed(0)
        model = Shifted()
        store = build_tables([model], (_plan("emb", 30, 3, "lazy_adam"), _plan("bag", 30, 2, "ftrl")), CPU,
                             torch.float32)

        def before(step, m=model):
            m.shift = step % 2 if changes else 0

        losses, _, _ = _train(model, store, depth, steps=12, batches=_shifted_batches(), before=before)
        runs.append((losses, store))
    assert runs[0][0] == runs[1][0]
    _same_state(runs[0][1], runs[1][1])
    stats = runs[1][1].prefetch_stats()
    if changes:  # recorded with the step before's shift: other ids, looked up as without prefetch (but the first)
        assert stats["served"] == 2 and stats["missed"] == 2 * 11
    else:
        assert stats["missed"] == 0


def test_recording_stops_before_batchnorm_and_after_the_last_lookup():
    torch.manual_seed(0)
    model = nn.ModuleDict({"emb": nn.Embedding(10, 2), "norm": nn.BatchNorm1d(2)})
    store = build_tables([model], (_plan("emb", 10, 2, "sgd"),), CPU, torch.float32)
    ids = torch.tensor([[1, 2], [3, 3]])

    def forward():
        x = model["emb"](ids).sum(1)
        calls.append("after lookup")
        return model["norm"](x)

    calls = []
    lookups, complete = record_lookups(forward, None, CPU, torch.float32)
    assert [n for n, _ in lookups] == ["emb"] and torch.equal(lookups[0][1], ids) and not complete
    assert calls == ["after lookup"] and int(model["norm"].num_batches_tracked) == 0  # stopped before it ran
    calls.clear()
    lookups, complete = record_lookups(forward, 1, CPU, torch.float32)
    assert len(lookups) == 1 and calls == []  # stopped right after its one lookup


def test_a_loaded_checkpoint_drops_the_queue():
    model, store = _wide_deep("lazy_adam", "ftrl")
    saved = {k: {"weight": v["weight"].clone(), "optimizer": {n: t.clone() if torch.is_tensor(t) else t
                                                              for n, t in v["optimizer"].items()}}
             for k, v in store.state_dict().items()}
    _, _, ahead = _train(model, store, 1, steps=3)
    assert len(ahead.batches) == 1 and len(store._ahead._queue) == 1  # the micro-batch drawn ahead, queued
    store.load_state_dict(saved)
    assert len(store._ahead._queue) == 0
    ahead.clear()
    assert len(ahead.batches) == 0


class FakeEvent:
    def __init__(self):
        self.waited = 0

    def record(self, stream=None):
        pass

    def synchronize(self):
        self.waited += 1


def test_pinned_ring_reuses_its_buffers_and_waits_for_their_copies(monkeypatch):
    """The CUDA path's buffers, with the CUDA calls stubbed (this machine has no GPU): a buffer is allocated once per
    slot and grown only when a copy needs more, and written again only after its last copy's event."""
    allocated = []
    real_empty = torch.empty

    def empty(*shape, pin_memory=False, **kw):
        allocated.append(shape[0])
        return real_empty(*shape, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    ring = PinnedRing(slots=2)
    seen = []
    for n in (10, 20, 10, 20, 400_000, 10):
        staged, slot = ring.stage((n, 4), torch.float32)
        assert staged.shape == (n, 4) and staged.dtype == torch.float32
        ring.sent(slot, torch.device("cuda"))
        seen.append(slot)
    assert seen == [0, 1, 0, 1, 0, 1]
    assert allocated == [1 << 20, 1 << 20, 1 << 23]  # one per slot, then slot 0 grown to 8 MiB for 6.4 MB
    assert ring.stage((20_000_000, 4), torch.float32) == (None, -1) and len(allocated) == 3  # 320 MB: not kept
    table = torch.arange(12.0).view(6, 2)
    rows = gather_to_device(table, torch.tensor([5, 0, 5]), CPU)  # the CPU path: one gather, no copy
    assert torch.equal(rows, table[[5, 0, 5]])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (this host has none: "
                                                          "torch.cuda.is_available() is False)")
def test_on_cuda_the_side_stream_prefetch_gives_the_serial_losses():
    """Host tables, the model on the GPU: rows deduplicated on the host, gathered into pinned buffers and copied on a
    side stream; the recorded ids compared on the device (written, never run in this project before a GPU run)."""
    gpu = torch.device("cuda")
    runs = []
    for depth in (0, 1):
        torch.manual_seed(0)
        model = WideDeep(13, 26, 8, 4, [8])
        plans = (_plan("deep_embedding", 208, 4, "lazy_adam"), _plan("wide_embedding", 208, 1, "ftrl"))
        store = build_tables([model], plans, gpu, torch.float32)
        model.to(gpu)
        opt = torch.optim.Adam(list(model.parameters()), lr=1e-2)
        batches = _batches()
        ahead = Lookahead(store, depth, gpu, torch.float32) if depth and store.start_prefetch() else None

        def draw(batches=batches):
            (dense, ids), labels = next(batches)
            return (dense.to(gpu), ids.to(gpu)), labels.to(gpu)

        losses = []
        for _ in range(16):
            batch = draw() if ahead is None else ahead.take(draw, lambda b: model(*b[0]))[0]
            loss = nn.functional.binary_cross_entropy_with_logits(model(*batch[0]), batch[1])
            loss.backward()
            store.collect()
            opt.step()
            opt.zero_grad()
            store.step()
            losses.append(loss.item())
        runs.append((losses, store))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(runs[1][1].state_dict(), runs[0][1].state_dict(), rtol=1e-6, atol=1e-7)
    assert runs[1][1].prefetch_stats()["served"] == 2 * 16
