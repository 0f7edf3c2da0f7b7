"""runtime.prepare() in one process (a real 1-rank gloo group, the plan a script would get with
placement.host_device_mix=1): a table that leaves the engine keeps your optimizer's kind. A user's SGD loop with its
table on the host equals the same loop with the table inside the engine (also when batches miss rows: row-sparse SGD
is exact), SGD with momentum and AdamW (lazy Adam) too when every row is looked up every step; an optimizer with no
twin says so."""

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher import runtime
from launcher.rundir import RUN_DIR_ENV
from tests.conftest import init_one_process_group


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    init_one_process_group()
    yield
    dist.destroy_process_group()


@pytest.fixture
def prepare_as(monkeypatch):
    """prepare() with a fresh runtime state and the default plan, its tables on the host when asked."""
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    inside = runtime._default_plan()

    def use(host: bool) -> None:
        plan = dataclasses.replace(inside, host_device_mix=1) if host else inside
        monkeypatch.setattr(runtime, "_default_plan", lambda: plan)
        monkeypatch.setattr(runtime, "_S", runtime._State())

    return use


def _train(prepare_as, host: bool, make_optimizer, every_row: bool) -> tuple[list[float], torch.Tensor]:
    """Six steps of a user's loop: (losses, the table's weights after them)."""
    prepare_as(host)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 1))
    model, optimizer = runtime.prepare(net, make_optimizer(net.parameters()))
    g = torch.Generator().manual_seed(1)
    target = torch.linspace(-1, 1, 8)[:, None]
    losses = []
    for _ in range(6):
        ids = torch.cat([torch.arange(10), torch.randint(0, 10, (14,), generator=g)]).view(8, 3) if every_row \
            else torch.randint(0, 7, (8, 3), generator=g)  # rows 7-9 never looked up
        loss = nn.functional.mse_loss(model(*runtime.move(ids)), target)
        runtime.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    table = runtime._S.tables.tables["0"].weight if host else net[0].weight
    return losses, table.detach().clone()


@pytest.mark.parametrize("make_optimizer, every_row, twin, follows", [
    (lambda p: torch.optim.SGD(p, lr=0.3), False, "sgd", "sgd"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01), True, "momentum",
     "momentum"),
    (lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1), True, "lazy_adam", "adamw"),
], ids=["sgd_rows_missed", "momentum_every_row", "adamw_every_row"])
def test_a_users_loop_with_a_host_table_matches_it_inside_the_engine(prepare_as, make_optimizer, every_row, twin,
                                                                    follows):
    inside, inside_table = _train(prepare_as, False, make_optimizer, every_row)
    host, host_table = _train(prepare_as, True, make_optimizer, every_row)
    plan = runtime._S.tables.tables["0"].plan
    assert (plan.location, plan.optimizer, plan.follows) == ("host", twin, follows)
    assert max(abs(a - b) for a, b in zip(host, inside)) <= 1e-6, (host, inside)
    # Adam divides by sqrt(v): a last-bit difference in a row's summed gradient comes out larger in its weights
    torch.testing.assert_close(host_table, inside_table, atol=1e-5 if twin == "lazy_adam" else 1e-6, rtol=0)
    torch.manual_seed(0)
    start = nn.Embedding(10, 4).weight.detach()
    moved = (host_table != start).any(dim=1)
    assert moved[:7].all() and moved[7:].tolist() == [every_row] * 3  # rows 7-9 stay put when never looked up


def test_an_optimizer_without_a_twin_warns_and_gets_lazy_adams_defaults(prepare_as):
    prepare_as(True)
    net = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 1))
    with pytest.warns(UserWarning, match=r"table 0 follows your Adagrad: lazy_adam \(row-sparse, lr 0.001, .*\) — "
                                         r"fallback: Adagrad has no row-sparse twin here"):
        runtime.prepare(net, torch.optim.Adagrad(net.parameters(), lr=0.05))
    plan = runtime._S.tables.tables["0"].plan
    assert (plan.optimizer, plan.lr, plan.follows) == ("lazy_adam", 0.001, "Adagrad")


def test_a_maximizing_optimizer_is_refused(prepare_as):
    prepare_as(True)
    net = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 1))
    with pytest.raises(ValueError, match=r"your SGD maximizes \(maximize=True\); the tables' row-sparse optimizers "
                                         r"minimize"):
        runtime.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, maximize=True))
