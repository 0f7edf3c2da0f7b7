"""The table stores, by registry (as the parallel parts and the launch backends are): each kind of store says which
planned tables it holds, how many of a table's rows one rank keeps (what its bytes are counted on), and how it is
built. ``build_tables`` (launcher/tables/lookup.py) asks the registry for each table's store; no code outside this
package picks a store by a table's location or shards.

- ``replicated``: a whole copy of each table on every data-parallel rank that holds it (ReplicatedTables, replicated.py),
  on the host or the device, as MindSpore's host EmbeddingLookup;
- ``sharded``: the rows split over the ranks of the table's group, one block each with its optimizer states
  (ShardedTables, sharded.py: parameter-server mode, placement.ps).

A new store is one module and one ``register`` line; a planned table must be held by exactly one kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.plan.placement import TablePlan
from launcher.tables.replicated import ReplicatedTables
from launcher.tables.sharded import ShardedTables


@dataclass
class StoreInputs:
    """What a rank hands every store it builds."""

    weights: dict[str, Any]
    """Table name -> the module's weight (a sharded store takes its block of it, or ``blocks``' copy)."""
    compute: Any
    """The torch.device lookups return their rows on."""
    dtype: Any
    dp_group: Any = None
    ps_group: Any = None
    ps_mesh: Any = None
    padding: dict[str, int | None] = field(default_factory=dict)
    blocks: dict[str, Any] | None = None


@dataclass(frozen=True)
class StoreKind:
    name: str
    holds: Callable[[TablePlan], bool]
    """Whether this kind of store holds the planned table."""
    rows_held: Callable[[TablePlan], int]
    """Rows of the table one holding rank keeps, with their optimizer states (its bytes are counted on them)."""
    build: Callable[[tuple[TablePlan, ...], StoreInputs], Any]
    """The store of these tables (a TableStore)."""


STORES: dict[str, StoreKind] = {}


def register(kind: StoreKind) -> StoreKind:
    if not kind.name or kind.name in STORES:
        raise ValueError(f"a table store needs a name of its own; {kind.name!r} is taken or empty")
    STORES[kind.name] = kind
    return kind


def store_kind(plan: TablePlan) -> StoreKind:
    """The one kind of store that holds ``plan``'s table."""
    kinds = [k for k in STORES.values() if k.holds(plan)]
    if len(kinds) != 1:
        raise ValueError(f"table {plan.name} ({plan.location}, {plan.shards} shard(s)) is held by "
                         f"{len(kinds)} kinds of table store ({', '.join(k.name for k in kinds) or 'none'}): "
                         f"exactly one must hold it")
    return kinds[0]


def _replicated(plans: tuple[TablePlan, ...], i: StoreInputs) -> Any:
    return ReplicatedTables(i.weights, plans, i.compute, i.dtype, i.dp_group, i.padding)


def _sharded(plans: tuple[TablePlan, ...], i: StoreInputs) -> Any:
    return ShardedTables(i.weights, plans, i.compute, i.dtype, i.ps_group, i.ps_mesh, i.padding, i.blocks)


register(StoreKind("replicated", holds=lambda p: p.outside and not p.sharded, rows_held=lambda p: p.rows,
                   build=_replicated))
register(StoreKind("sharded", holds=lambda p: p.outside and p.sharded, rows_held=lambda p: -(-p.rows // p.shards),
                   build=_sharded))
