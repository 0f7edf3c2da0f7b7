"""Reading a user's Dataset: workers and streams give the batches one process reads on its training thread, the
training thread's random state is left alone, resume reads on exactly, and the loader's keys are checked for
meaning (launcher/usercode/loading.py, stream.py, launcher/plan/loader.py)."""

import random

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from launcher.plan.loader import plan_loader
from launcher.usercode.data import MapData
from launcher.usercode.data import StreamData
from launcher.usercode.stream import EmptyStream


class Jittered(Dataset):
    """Item i is i plus random noise from torch and Python's generators (an augmentation)."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.tensor([float(i) + torch.rand(()).item() + random.random()]), torch.tensor(float(i))


class Shuffled(IterableDataset):
    """0..n-1 in an order drawn from torch's generator each time it is read, with noise."""

    def __init__(self, n):
        self.n, self.epochs = n, []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        for i in torch.randperm(self.n).tolist():
            yield torch.tensor([float(i) + torch.rand(()).item()]), torch.tensor(float(i))


def take(it, k):
    return [next(it) for _ in range(k)]


def same(a, b):
    return all(torch.equal(x[0][0], y[0][0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_workers_read_what_the_training_thread_reads_and_leave_its_random_state(kind):
    def data(workers):
        settings = {"num_workers": workers, **({"persistent_workers": True} if workers else {})}
        return (MapData(Jittered(), None, settings=settings) if kind == "map"
                else StreamData(Shuffled(37), None, settings=settings))

    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    alone = take(data(0).train_batches(0, 1, 4, seed=3), 12)  # 12 × 4 > one epoch: the next epoch is read too
    assert torch.equal(torch.rand(3), before)  # reading drew nothing from the training thread's generator
    assert same(alone, take(data(2).train_batches(0, 1, 4, seed=3), 12))
    noise = torch.cat([b[0][0][:, 0] - b[1] for b in alone])
    assert noise.min() >= 0 and noise.max() < 2 and len(set(noise.tolist())) == len(noise)  # jittered, not fixed


def test_a_stream_is_dealt_over_ranks_once_per_epoch_and_resumes_exactly():
    stream = Shuffled(37)
    data = StreamData(stream, Shuffled(7))
    one = take(data.train_batches(0, 1, 8, seed=3), 8)  # 37 // 8 = 4 global micro-batches an epoch: the tail drops
    two = [take(data.train_batches(r, 2, 4, seed=3), 8) for r in (0, 1)]
    for k in range(8):
        assert torch.equal(torch.cat([two[0][k][1], two[1][k][1]]), one[k][1])
    epoch0 = torch.cat([b[1] for b in one[:4]]).tolist()
    assert len(set(epoch0)) == 32 and epoch0 != torch.cat([b[1] for b in one[4:]]).tolist()  # reshuffled
    assert stream.epochs[:2] == [0, 1]
    assert same(take(data.train_batches(1, 2, 4, seed=3, start=5), 3), two[1][5:8])
    per_rank = [[b[1].tolist() for b in data.eval_batches(r, 2, 2, count=0)] for r in (0, 1)]
    assert [len(b) for b in per_rank[0]] == [len(b) for b in per_rank[1]] == [2, 2]  # 7 items: 4, then 3 padded to 4
    seen = [x for r in per_rank for b in r for x in b]
    assert sorted(set(seen)) == list(range(7)) and len(seen) == 8  # every item, one of the last 3 again
    assert len(list(data.eval_batches(0, 2, 2, count=1))) == 1


def test_a_stream_shorter_than_a_global_micro_batch_says_so():
    with pytest.raises(EmptyStream, match="fewer items than one global micro-batch"):
        next(StreamData(Shuffled(5)).train_batches(0, 2, 4, seed=1))


CPU = {"cores": 16, "nproc": 2, "device_type": "cpu", "stream": False}
DEFAULT = {"num_workers": "auto", "pin_memory": "auto", "prefetch_factor": None, "persistent_workers": "auto",
           "collate_fn": None}


def plan(seconds=0.0, share=1.0, micro=32, user=True, **loader):
    kw = {**CPU, **{k: loader.pop(k) for k in list(loader) if k in CPU}}
    return plan_loader({**DEFAULT, **loader}, user, seconds, share, micro, kw["cores"], kw["nproc"],
                       kw["device_type"], kw["stream"])


def test_auto_workers_follow_the_reading_time_and_the_cores():
    assert plan(1e-6)[0].num_workers == 0  # 32 µs a micro-batch: a worker's hand-over costs more
    assert plan(1e-3)[0].num_workers == 4  # 32 ms: 8 cores a rank, at most 4 workers
    assert plan(1e-3, nproc=8)[0].num_workers == 1
    assert plan(1e-3, cores=2)[0].num_workers == 0 and "no core is spare" in plan(1e-3, cores=2)[0].why
    assert plan(1e-3, share=0.1, cores=2)[0].num_workers == 2  # reading that waits needs no spare core
    got = plan(1e-3, device_type="cuda")[0]
    assert got.pin_memory and got.persistent_workers and got.kwargs()["num_workers"] == 4
    assert plan(1e-3, num_workers=0)[0].kwargs() == {"num_workers": 0, "pin_memory": False}


@pytest.mark.parametrize("loader,words", [
    ({"num_workers": -1}, "loader.num_workers=-1"), ({"num_workers": True}, "loader.num_workers=True"),
    ({"num_workers": 1000}, "to 256"), ({"pin_memory": True}, "this run is on the CPU"),
    ({"pin_memory": "yes"}, "true, false or auto"), ({"prefetch_factor": 0}, "loader.prefetch_factor=0"),
    ({"prefetch_factor": 4, "num_workers": 0}, "this run has none"),
    ({"persistent_workers": True}, "this run has none"),  # auto chose no workers for fast reading
])
def test_a_loader_value_that_means_nothing_is_refused(loader, words):
    got, problems = plan(**loader)
    assert got is None and any(words in p for p in problems), problems


def test_a_stream_keeps_no_workers_between_epochs():
    """A stream trains through one endless DataLoader pass (stream.read): the plan does not promise workers kept
    between epochs, and refuses persistent_workers=true, which would keep nothing."""
    kept, _ = plan(1e-3)
    assert kept.persistent_workers and "kept between epochs" in kept.line()
    got, problems = plan(1e-3, stream=True)
    assert problems == [] and got.num_workers == 4 and not got.persistent_workers
    assert "kept between epochs" not in got.line() and got.kwargs()["persistent_workers"] is False
    got, problems = plan(1e-3, stream=True, persistent_workers=True)
    assert got is None and "the train data is a stream" in problems[0]
    assert plan(1e-3, stream=True, persistent_workers=False)[1] == []


def test_a_built_in_recipe_refuses_loader_keys():
    assert plan(user=False)[1] == [] and plan(user=False)[0] is None
    assert "makes whole batches itself" in plan(user=False, num_workers=2)[1][0]


def test_the_launcher_reads_a_stream_once_before_the_plan(tmp_path, monkeypatch):
    """Preflight checks the first items, their labels and their read time from one pass over a user's stream (a
    stream may be a remote dataset: each pass costs)."""
    import sys

    from launcher.config import compose_config
    from launcher.facts.preflight import gather_facts
    from tests.usercode.loader_project import write_project

    project = write_project(tmp_path / "my_loaders")
    monkeypatch.syspath_prepend(str(project))
    for name in [m for m in sys.modules if m == "loaders" or m.startswith("loaders.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.chdir(project)
    cfg = compose_config(["recipe=stream"], "conf")
    facts = gather_facts(cfg, "conf")
    import loaders.data

    assert loaders.data.Stream.opened == 2  # data once, eval_data once
    assert facts.data.train_samples is None and facts.data.binary_labels and facts.data.item_seconds > 0
    for name in [m for m in sys.modules if m == "loaders" or m.startswith("loaders.")]:
        del sys.modules[name]
