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
