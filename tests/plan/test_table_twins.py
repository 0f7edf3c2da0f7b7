"""A table with no tables.<path> entry trains with the row-sparse twin of the dense optimizer (issue 20: SGD and
momentum models no longer get lazy Adam at lr 1e-3), and the plan says which twin each table got and how it differs;
a tables.<path>.optimizer entry wins."""

import dataclasses

import pytest

from rich.console import Console

from launcher.errors import ConfigError
from launcher.plan.placement import DenseSettings, TablePlan, follow_dense, twin_words
from launcher.report.plan_view import placement_table
from tests.conftest import plan_of

NO_DEEP_ENTRY = ["recipe=wide_deep", "~tables.deep_embedding", "placement.host_device_mix=1", "model.rows_per_table=100"]


def _tables(plan) -> dict[str, TablePlan]:
    return {t.name: t for t in plan.placement.tables}


def _view(plan) -> str:
    console = Console(width=250, record=True)
    console.print(placement_table(plan))
    return console.export_text()


def test_an_sgd_models_table_gets_exact_row_sparse_sgd_and_the_plan_says_so(cpu_host):
    plan = plan_of([*NO_DEEP_ENTRY, "optimizer.name=sgd", "optimizer.lr=0.2"], cpu_host)
    deep, wide = _tables(plan)["deep_embedding"], _tables(plan)["wide_embedding"]
    assert (deep.optimizer, deep.lr, deep.momentum, deep.follows) == ("sgd", 0.2, 0.0, "sgd")
    assert deep.differs.startswith("exact:")
    assert (wide.optimizer, wide.follows) == ("ftrl", "")  # its tables.<path> entry wins
    assert any(n.startswith("table deep_embedding follows optimizer.name=sgd: sgd (row-sparse, lr 0.2) — exact:")
               for n in plan.notes), plan.notes
    view = _view(plan)
    assert "sgd rows (exact twin of sgd)" in view and "ftrl rows " in view
    assert plan.memory.host.table_states == 2 * 26 * 100 * 4  # plain SGD keeps no state: FTRL's n and z only


def test_a_momentum_models_table_gets_lazy_momentum_with_its_factor(cpu_host):
    plan = plan_of([*NO_DEEP_ENTRY, "optimizer.name=momentum", "optimizer.momentum=0.9", "optimizer.lr=0.05",
                    "optimizer.weight_decay=0.01"], cpu_host)
    deep = _tables(plan)["deep_embedding"]
    assert (deep.optimizer, deep.lr, deep.momentum, deep.weight_decay) == ("momentum", 0.05, 0.9, 0.01)
    assert deep.differs.startswith("lazy: a row's momentum buffer decays")
    note = next(n for n in plan.notes if n.startswith("table deep_embedding"))
    assert "momentum (row-sparse, lr 0.05, momentum 0.9, weight decay 0.01) — lazy:" in note, note
    assert "momentum rows (lazy twin of momentum)" in _view(plan)
    assert plan.memory.host.table_states == 26 * 100 * 16 * 4 + 2 * 26 * 100 * 4  # the buffer + FTRL's n and z


def test_an_adamw_models_table_gets_lazy_adam_with_its_settings(cpu_host):
    plan = plan_of([*NO_DEEP_ENTRY, "optimizer.name=adamw", "optimizer.lr=0.003", "optimizer.weight_decay=0.1"],
                   cpu_host)
    deep = _tables(plan)["deep_embedding"]
    assert (deep.optimizer, deep.lr, deep.weight_decay, deep.decoupled_decay) == ("lazy_adam", 0.003, 0.1, True)
    assert twin_words(deep) == "lazy twin of adamw"


def test_an_explicit_table_optimizer_wins_and_momentum_takes_the_dense_factor(cpu_host):
    plan = plan_of(["recipe=wide_deep", "tables.deep_embedding.optimizer=momentum", "optimizer.name=adam",
                    "optimizer.momentum=0.8", "model.rows_per_table=100"], cpu_host)
    deep = _tables(plan)["deep_embedding"]
    assert (deep.optimizer, deep.lr, deep.momentum, deep.follows) == ("momentum", 0.001, 0.8, "")
    with pytest.raises(ConfigError, match=r"tables.deep_embedding.optimizer=momentum takes its momentum factor from "
                                          r"the dense optimizer \(optimizer.name=adam\), whose momentum is 0.0\. .*"
                                          r"or set tables.deep_embedding.optimizer=sgd\."):
        plan_of(["recipe=wide_deep", "tables.deep_embedding.optimizer=momentum", "model.rows_per_table=100"],
                cpu_host)


@pytest.mark.parametrize("dense, optimizer, kind", [
    (DenseSettings("momentum", 0.1, momentum=0.0), "sgd", "exact"),  # momentum 0 is SGD
    (DenseSettings("sgd", 0.1, weight_decay=0.01), "sgd", "lazy"),  # torch decays every row
    (DenseSettings("NAdam", 0.002, betas=(0.9, 0.99)), "lazy_adam", "stand-in"),
    (DenseSettings("Adagrad", 0.01), "lazy_adam", "fallback"),
])
def test_each_dense_optimizer_gets_a_twin_a_stand_in_or_the_fallback(dense, optimizer, kind):
    t = TablePlan(name="emb", rows=10, dim=4, location="host", optimizer="lazy_adam", lr=0.001, betas=(0.9, 0.999),
                  eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)
    got = follow_dense(t, dense)
    assert (got.optimizer, got.differs.partition(":")[0]) == (optimizer, kind)
    assert got.lr == (0.001 if kind == "fallback" else dense.lr)  # no Adagrad lr in lazy Adam


def test_the_placement_table_wraps_a_long_module_path_at_80_columns(cpu_host):
    """A CI log is 80 columns: a table's path wraps inside its cell, it never ends in an ellipsis."""
    plan = plan_of([*NO_DEEP_ENTRY, "optimizer.name=sgd"], cpu_host)
    long = "towers.0.user_tower.embeddings.deep_embedding_of_a_very_long_name"
    plan = dataclasses.replace(plan, placement=dataclasses.replace(plan.placement, tables=tuple(
        dataclasses.replace(t, name=long) if t.name == "deep_embedding" else t for t in plan.placement.tables)))
    console = Console(width=80, record=True)
    console.print(placement_table(plan))
    text = console.export_text()
    assert "…" not in text
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.count("│") > 2)
    assert long in cells
