"""The fused C path of the host tables (launcher/tables/kernels.c) against the torch ops it replaced, through the
stores as the Trainer drives them: every table optimizer, replicated and parameter-server tables, with prefetch, and
across a checkpoint written on the torch path: per step <= 1e-6 apart (the kernels round as torch's ops do; sums
of a row's gradients keep their order, only the rows' order differs)."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist

import launcher.tables.kernels as kernels
from launcher.tables import build_tables
from tests.tables import test_prefetch as prefetch
from tests.tables import test_sharded as sharded

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"the C kernels did not load: {kernels.why_not()}")

PAIRS = [("lazy_adam", "ftrl"), ("momentum", "sgd"), ("adagrad", "rowwise_adagrad")]
"""(deep table's optimizer, wide table's) of wide_deep: every row-sparse optimizer the kernels run."""


def _close(a: dict, b: dict) -> None:
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


class _TorchOps:
    """While entered, the stores take torch's ops (a host where the kernels did not build)."""

    def __enter__(self):
        self.lib, kernels._lib = kernels._lib, None

    def __exit__(self, *exc):
        kernels._lib = self.lib


@pytest.mark.parametrize("deep, wide", PAIRS)
@pytest.mark.parametrize("depth", [0, 2])
def test_replicated_tables_step_as_the_torch_ops(deep, wide, depth):
    runs = []
    for ops in (_TorchOps, None):
        with ops() if ops else nullcontext():
            model, store = prefetch._wide_deep(deep, wide)
            losses, _, ahead = prefetch._train(model, store, depth, steps=12, accum=2)
            runs.append((losses, copy.deepcopy(store.state_dict())))
            if ahead is not None:
                store.drop_prefetch(stop=True)
    (want, want_state), (got, got_state) = runs
    assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
    _close(got_state, want_state)


@pytest.mark.parametrize("deep, wide", PAIRS)
def test_a_checkpoint_of_the_torch_path_resumes_on_the_kernels(deep, wide):
    """Trained 6 steps on torch's ops and saved; resumed on the kernels (and, for reference, on torch's ops): the
    next 6 steps agree."""
    batches = list(_take(prefetch._batches(), 12))
    with _TorchOps():
        model, store = prefetch._wide_deep(deep, wide)
        prefetch._train(model, store, 0, steps=6, batches=iter(batches[:6]))
        saved = copy.deepcopy({"model": model.state_dict(), "tables": store.state_dict()})
    runs = []
    for ops in (_TorchOps, None):
        with ops() if ops else nullcontext():
            model, store = prefetch._wide_deep(deep, wide)
            model.load_state_dict(saved["model"])
            store.load_state_dict(copy.deepcopy(saved["tables"]))
            losses, _, _ = prefetch._train(model, store, 0, steps=6, batches=iter(batches[6:]))
            runs.append((losses, store.state_dict()))
    assert runs[1][0] == pytest.approx(runs[0][0], rel=1e-6, abs=1e-7)
    _close(runs[1][1], runs[0][1])


PS_SETS = [{"emb": "lazy_adam", "wide": "ftrl", "bag": "momentum"},
           {"emb": "adagrad", "wide": "rowwise_adagrad", "bag": "sgd"}]


def _ps_rank(rank: int, port: int, world: int) -> dict:
    """Per optimizer set and path (torch, kernels): the losses and held blocks of a sharded store on ``world``
    ranks."""
    mesh = sharded._join(rank, port, world)
    out = {}
    for k, optimizers in enumerate(PS_SETS):
        for path, ops in (("torch", _TorchOps), ("kernels", None)):
            with ops() if ops else nullcontext():
                torch.manual_seed(0)
                model = sharded.UserModel()
                store = build_tables([model], sharded._plans(world, optimizers), torch.device("cpu"), torch.float32,
                                     None, mesh.get_group(), mesh)
                out[k, path] = {"losses": sharded._train(model, store, rank, steps=5), **sharded._held(store)}
    dist.destroy_process_group()
    return out


@pytest.mark.integration
def test_ps_tables_step_as_the_torch_ops(tmp_path):
    got = sharded._spawn("_ps_rank", tmp_path, 2, module="tests.tables.test_kernel_paths")
    for rank_out in got.values():
        for k in range(len(PS_SETS)):
            want, have = rank_out[k, "torch"], rank_out[k, "kernels"]
            assert have["losses"] == pytest.approx(want["losses"], rel=1e-6, abs=1e-7)
            _close(have["held"], want["held"])


def _take(it, n):
    for _ in range(n):
        yield next(it)
