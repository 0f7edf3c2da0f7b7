"""The sharded table store (parameter-server mode) against the replicated one, over real gloo processes: a user's
model with an nn.Embedding (padding_idx), a one-column nn.Embedding looked up with the same ids and an
nn.EmbeddingBag, trained with lazy Adam, FTRL and SGD with momentum, with two micro-batches a step, one rank's
batch empty now and then. Every step's loss and, at the end, every row and optimizer state agree; each rank holds
only its block; a checkpoint written by 4 ranks loads onto 2 (DCP reshards the blocks)."""

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.plan import TablePlan
from launcher.tables import build_tables
from launcher.tables.partition import RowPartition

ROOT = Path(__file__).resolve().parents[2]
ROWS = {"emb": 50, "wide": 50, "bag": 37}
OPTIMIZERS = {"emb": "lazy_adam", "wide": "ftrl", "bag": "momentum"}


def _spawn(fn: str, tmp_path: Path, world: int, *args: str, module: str = "tests.tables.test_sharded") -> dict:
    """Run ``module``'s ``fn(rank, port, world, *args)`` on ``world`` processes; {rank: what it returned}."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fast_exit: no interpreter teardown, which can abort a rank whose gloo threads are still joinable (SIGABRT,
    # "terminate called without an active exception") and costs ~0.7 s a process (launcher/fastexit.py)
    code = (f"import sys, torch; from {module} import {fn}; "
            f"torch.save({fn}(int(sys.argv[1]), {port}, {world}, *sys.argv[3:]), sys.argv[2]); "
            f"from launcher.fastexit import fast_exit; fast_exit(0)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(tmp_path / f"{fn}{r}.pt"), *args], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for r in range(world)]
    assert [p.wait(timeout=180) for p in procs] == [0] * world
    return {r: torch.load(tmp_path / f"{fn}{r}.pt", weights_only=False) for r in range(world)}


def _join(rank: int, port: int, world: int):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,), mesh_dim_names=("stage",))


class UserModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(ROWS["emb"], 4, padding_idx=0)
        self.wide = nn.Embedding(ROWS["wide"], 1)
        self.bag = nn.EmbeddingBag(ROWS["bag"], 3, mode="mean")
        self.head = nn.Linear(8, 1).requires_grad_(False)  # the dense part stays put: only the tables train

    def forward(self, ids, bag_ids):
        x = torch.cat([self.emb(ids).sum(1), self.wide(ids).sum(1), self.bag(bag_ids)], dim=1)
        return self.head(x).squeeze(1)


def _plans(shards: int, optimizers: dict[str, str] = OPTIMIZERS) -> tuple[TablePlan, ...]:
    dims = {"emb": 4, "wide": 1, "bag": 3}
    return tuple(TablePlan(name=n, rows=ROWS[n], dim=dims[n], location="host", optimizer=optimizers[n], lr=0.05,
                           betas=(0.9, 0.999), eps=1e-8, l1=0.001, l2=0.001, lr_power=-0.5, initial_accumulator=0.1,
                           momentum=0.9, shards=shards) for n in ROWS)


def _batch(rank: int, step: int, micro: int):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    n = 0 if (step + rank) % 5 == 4 else 6  # now and then one rank's batch is empty
    ids = torch.randint(0, ROWS["emb"], (n, 3), generator=g) ** 2 % ROWS["emb"]  # skewed, with repeats
    bag_ids = torch.randint(0, ROWS["bag"], (n, 2), generator=g)
    return ids, bag_ids, torch.rand(n, generator=g)


def _train(model, store, rank: int, steps: int) -> list[float]:
    losses = []
    for step in range(steps):
        total = 0.0
        for micro in range(2):
            ids, bag_ids, y = _batch(rank, step, micro)
            loss = ((model(ids, bag_ids) - y) ** 2).sum()
            loss.backward()
            store.collect()
            total += loss.item()
        store.step()
        losses.append(total)
    return losses


def _compare_rank(rank: int, port: int, world: int) -> dict:
    mesh = _join(rank, port, world)
    out = _compare(rank, world, mesh)
    dist.destroy_process_group()
    return out


def _compare(rank: int, world: int, mesh) -> dict:
    """{replicated, sharded: {losses, held, steps}} of this rank: the same model and batches on both stores."""
    out = {}
    for kind, shards in (("replicated", 1), ("sharded", world)):
        torch.manual_seed(0)
        model = UserModel()
        store = build_tables([model], _plans(shards), torch.device("cpu"), torch.float32, dist.group.WORLD,
                             mesh.get_group(), mesh)
        out[kind] = {"losses": _train(model, store, rank, steps=6),
                     **_held(store)}
    return out


def _four_rank(rank: int, port: int, world: int, path: str) -> dict:
    """One 4-rank job for both tests on 4 ranks (each spawn of 4 processes costs ~10 s of importing torch on 2
    cores): the comparison, then the checkpoint written for the 2-rank resume, on the same process group."""
    mesh = _join(rank, port, world)
    out = {"compare": _compare(rank, world, mesh), "saved": _save(rank, world, mesh, path)}
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> tuple[dict, str]:
    """({rank: {compare, saved}}, the checkpoint's path) of one 4-rank job."""
    tmp = tmp_path_factory.mktemp("four")
    path = str(tmp / "ckpt")
    return _spawn("_four_rank", tmp, 4, path), path


@pytest.mark.integration
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_tables_train_as_replicated_ones(tmp_path, world, request):
    if world == 4:
        got = {r: out["compare"] for r, out in request.getfixturevalue("four")[0].items()}
    else:
        got = _spawn("_compare_rank", tmp_path, world)
    for r in range(world):
        assert got[r]["replicated"]["losses"] == pytest.approx(got[r]["sharded"]["losses"], rel=1e-6, abs=1e-7)
    whole = got[0]["replicated"]["held"]
    for name, rows in ROWS.items():
        part = RowPartition(rows, world)
        blocks = [got[r]["sharded"]["held"][name] for r in range(world)]
        assert [len(w) for w, _ in blocks] == [part.owned(r) for r in range(world)]  # each rank: its block only
        torch.testing.assert_close(torch.cat([w for w, _ in blocks]), whole[name][0], rtol=1e-6, atol=1e-7)
        for k, state in enumerate(whole[name][1]):
            torch.testing.assert_close(torch.cat([s[k] for _, s in blocks]), state, rtol=1e-6, atol=1e-7)


def _save(rank: int, world: int, mesh, path: str) -> dict:
    """A sharded store trained 3 steps and saved to ``path`` with DCP: {losses, held, steps} of this rank."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = UserModel()
    store = build_tables([model], _plans(world), torch.device("cpu"), torch.float32, None, mesh.get_group(), mesh)
    losses = _train(model, store, rank, steps=3)
    dcp.save({"tables": store.state_dict()}, checkpoint_id=path)
    return {"losses": losses, **_held(store)}


def _resume_rank(rank: int, port: int, world: int, path: str) -> dict:
    import torch.distributed.checkpoint as dcp

    mesh = _join(rank, port, world)
    torch.manual_seed(1)  # other initial rows: the checkpoint must replace them
    model = UserModel()
    store = build_tables([model], _plans(world), torch.device("cpu"), torch.float32, None, mesh.get_group(), mesh)
    state = {"tables": store.state_dict()}
    dcp.load(state, checkpoint_id=path)
    store.load_state_dict(state["tables"])
    dist.destroy_process_group()
    return _held(store)


def _held(store) -> dict:
    return {"held": {n: (w.clone(), [s.clone() for s in states]) for n, (_, w, states) in store.held().items()},
            "steps": {n: t.optimizer.state_dict().get("steps") for n, t in store.tables.items()}}


@pytest.mark.integration
def test_a_checkpoint_of_4_shards_loads_onto_2(tmp_path, four):
    saved, path = {r: out["saved"] for r, out in four[0].items()}, four[1]
    two = _spawn("_resume_rank", tmp_path, 2, path)
    for name in ROWS:
        w4 = torch.cat([saved[r]["held"][name][0] for r in range(4)])
        w2 = torch.cat([two[r]["held"][name][0] for r in range(2)])
        assert torch.equal(w2, w4)
        for k in range(len(saved[0]["held"][name][1])):
            assert torch.equal(torch.cat([two[r]["held"][name][1][k] for r in range(2)]),
                               torch.cat([saved[r]["held"][name][1][k] for r in range(4)]))
        assert two[0]["steps"][name] == saved[0]["steps"][name] == (None if name == "wide" else 3)  # FTRL: none


def test_an_ids_buffer_refilled_in_place_is_routed_again():
    """A loop that refills one ids tensor each batch gets each batch's rows, in training and in evaluation; a second
    table on the same ids in the same forward shares the route."""
    torch.manual_seed(0)
    model = UserModel()
    store = build_tables([model], _plans(2), torch.device("cpu"), torch.float32)  # one process: a group of 1
    ids = torch.tensor([[1, 2, 2]])
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for fill in ([1, 2, 2], [7, 8, 9]):
                ids.copy_(torch.tensor([fill]))
                got = model.emb(ids)
                assert torch.equal(got.detach(), store.tables["emb"].weight[torch.tensor([fill])])
                model.wide(ids)
                if grad:
                    got.sum().backward()
                    store.collect()
        store.discard()
    with pytest.raises(IndexError, match="index out of range"):
        model.emb(torch.tensor([[ROWS["emb"]]]))
