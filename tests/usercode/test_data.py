"""MapData: a user's Dataset batched and sharded as PyTorch users expect, the same samples however it is split."""

import torch
from torch.utils.data import TensorDataset

from launcher.usercode.data import MapData

SPEC = {"_target_": "torch.utils.data.TensorDataset"}


def _data(n: int) -> MapData:
    return MapData(TensorDataset(torch.arange(n).float()[:, None], torch.arange(n).float()),
                   TensorDataset(torch.arange(5).float()[:, None], torch.arange(5).float()))


def _take(it, k):
    return [next(it) for _ in range(k)]


def test_a_global_micro_batch_is_the_same_samples_on_one_or_two_ranks():
    data = _data(23)  # 23 // 8 = 2 global micro-batches of 2 × 4 per epoch: crosses epochs
    one = _take(data.train_batches(0, 1, 8, seed=3), 6)
    two = [_take(data.train_batches(r, 2, 4, seed=3), 6) for r in (0, 1)]
    for k in range(6):
        together = torch.cat([two[0][k][1], two[1][k][1]])
        assert sorted(together.tolist()) == sorted(one[k][1].tolist())
    assert sorted(one[0][1].tolist()) != sorted(one[2][1].tolist())  # reshuffled the next epoch


def test_resuming_at_a_position_gives_the_batches_that_came_next():
    data = _data(23)
    straight = _take(data.train_batches(1, 2, 4, seed=3), 7)
    resumed = _take(data.train_batches(1, 2, 4, seed=3, start=3), 4)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(straight[3:], resumed))


def test_every_rank_evaluates_the_same_number_of_equal_batches():
    data = _data(8)
    per_rank = [[len(b[1]) for b in data.eval_batches(r, 2, 2, count=0)] for r in (0, 1)]
    assert per_rank == [[2, 1], [2, 1]]  # 5 items padded to 6, dealt 3 per rank: forwards stay in step
    seen = sorted(x for r in (0, 1) for b in data.eval_batches(r, 2, 2, count=0) for x in b[1].tolist())
    assert seen == [0, 0, 1, 2, 3, 4]  # every item, the first one again as padding


class _Slow(torch.utils.data.Dataset):
    """A dataset on a slow store: 0.05 s an item."""

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        import time

        time.sleep(0.05)
        return torch.tensor([float(i)]), torch.tensor(float(i % 2))


class _SlowStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(1000):
            yield _Slow()[i]


def test_the_launcher_reads_a_slow_datasets_first_items_for_a_bounded_time(monkeypatch):
    """The first LABEL_SCAN items are read before launch: from a slow store that kept the launcher silent for minutes
    (256 items at 1 s). It stops at READ_SECONDS with what it has (two at least), a stream's length left unknown."""
    import time

    from launcher.usercode import data_check

    monkeypatch.setattr(data_check, "READ_SECONDS", 0.3)
    for dataset in (_Slow(), _SlowStream()):
        t0 = time.monotonic()
        sample = data_check.read_sample(dataset, 256, count_to=1000)
        took = time.monotonic() - t0
        assert 2 <= len(sample.items) < 20 and took < 1.5, (type(dataset).__name__, len(sample.items), took)
        assert sample.ended is None and [float(x) for x, _ in sample.items] == list(range(len(sample.items)))
    monkeypatch.setattr(data_check, "READ_SECONDS", 1e-6)  # two items at least, however slow
    assert len(data_check.read_sample(_Slow(), 256).items) == 2
