"""Table stores by registry (launcher/tables/registry.py): every planned table outside the parts is held by exactly
one kind of store, each kind counts the rows a rank keeps, and no code outside tables/ and the placement's types
tests a table's location or shards by hand (it asks TablePlan: outside, on_host, sharded)."""

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from launcher.plan.placement import TablePlan
from launcher.tables.registry import STORES, StoreKind, register, store_kind
from launcher.tables.lookup import build_tables
from launcher.tables.replicated import ReplicatedTables

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
ALLOWED = ("launcher/tables/", "launcher/plan/placement_types.py")


def _plan(name: str, location: str = "host", shards: int = 1, rows: int = 10) -> TablePlan:
    return TablePlan(name, rows, 4, location, "sgd", 0.1, (0.9, 0.999), 1e-8, 0.0, 0.0, -0.5, 0.1, shards=shards)


def test_each_planned_table_has_one_store_which_counts_its_rows():
    assert store_kind(_plan("a")).name == "replicated" and store_kind(_plan("a", "device")).name == "replicated"
    sharded = _plan("b", shards=4, rows=10)
    assert store_kind(sharded).name == "sharded" and store_kind(sharded).rows_held(sharded) == 3  # ceil(10 / 4)
    assert STORES["replicated"].rows_held(_plan("a", rows=10)) == 10
    with pytest.raises(ValueError, match="held by 0 kinds of table store"):
        store_kind(_plan("c", "engine"))  # trained by the parts: no store holds it


def test_a_second_kind_that_holds_the_same_tables_is_refused_and_a_name_is_taken_once():
    twin = StoreKind("twin", holds=lambda p: p.outside and not p.sharded, rows_held=lambda p: p.rows,
                     build=STORES["replicated"].build)
    register(twin)
    try:
        with pytest.raises(ValueError, match=r"held by 2 kinds of table store \(replicated, twin\)"):
            store_kind(_plan("a"))
        with pytest.raises(ValueError, match="taken"):
            register(twin)
    finally:
        del STORES["twin"]


def test_build_tables_puts_each_table_in_the_store_its_kind_builds():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
    store = build_tables([model], (_plan("0"),), torch.device("cpu"), torch.float32)
    assert isinstance(store, ReplicatedTables) and set(store.tables) == {"0"}
    if store.huge_pages is not None:
        store.huge_pages.wait()


def test_no_location_or_shards_test_outside_the_tables_and_the_placement_types():
    found = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        rel = path.relative_to(LAUNCHER.parent).as_posix()
        if rel.startswith(ALLOWED[0]) or rel == ALLOWED[1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(x, ast.Attribute) and x.attr in ("location", "shards")
                                                     for x in (node.left, *node.comparators)):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"a table's location or shards tested by hand (ask TablePlan.outside/on_host/sharded): {found}"
