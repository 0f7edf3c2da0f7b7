"""Embedding tables trained outside the parallel parts: the TableStore protocol (store.py), the replicated store
(replicated.py), the lookup that stands in the model (lookup.py), row-sparse optimizers (sparse_optim.py), the
sparse-gradient exchange (sparse_comm.py) and host <-> device transfers (transfer.py)."""

from launcher.tables.lookup import TableLookup, build_tables, movable
from launcher.tables.replicated import ReplicatedTables
from launcher.tables.store import TableStore

__all__ = ["ReplicatedTables", "TableLookup", "TableStore", "build_tables", "movable"]
