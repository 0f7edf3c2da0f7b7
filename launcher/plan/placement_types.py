"""The placement's types: each table's plan (``TablePlan``: where it lives, how it trains, over how many ranks its
rows are split), the dense optimizer tables follow (``DenseSettings``) and the whole placement (``PlacementPlan``).
A leaf of the plan; what a table's location and shards mean is asked of ``TablePlan`` (``outside``, ``on_host``,
``sharded``), here only, and the table stores say which of them each holds (launcher/tables/registry.py).
launcher/plan/placement.py plans them."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.host_modules import ModulePlan


@dataclass(frozen=True)
class TablePlan:
    name: str
    rows: int
    dim: int
    location: str
    """host or device: where the table, its lookups and its optimizer state live; engine: trained with the rest of
    the model by the parallel parts (dense)."""
    optimizer: str
    """A TABLE_OPTIMIZERS name (launcher/tables/sparse_optim.py: lazy_adam, adagrad, ftrl, sgd, ...), or dense."""
    lr: float
    betas: tuple[float, float]
    eps: float
    l1: float
    l2: float
    lr_power: float
    initial_accumulator: float
    weight_decay: float = 0.0
    """lazy_adam, sgd, momentum: weight decay of the rows it updates (the dense optimizer's when the table follows
    it)."""
    decoupled_decay: bool = True
    """True: AdamW's decoupled decay (w -= lr * weight_decay * w); False: Adam's L2 (g += weight_decay * w)."""
    momentum: float = 0.0
    """momentum: the buffer's factor (the dense optimizer's: optimizer.momentum, or your SGD group's)."""
    dampening: float = 0.0
    nesterov: bool = False
    follows: str = ""
    """The dense optimizer whose kind and settings the table took (sgd, momentum, adam, adamw, or in
    runtime.prepare() your optimizer's class when it has none of those); '' = its tables.<path> entry chose."""
    differs: str = ""
    """With ``follows``: '<kind>: how', kind exact, lazy, stand-in or fallback: how the table's training differs from
    what the dense optimizer would do to it."""
    shards: int = 1
    """Ranks its rows are split over (parameter-server mode, placement.ps / placement.tables.<name>=ps): 1 = every
    rank that holds the table has a whole copy; n > 1 = the n ranks of the table's pipeline stage (all ranks without
    pipeline stages) each own one contiguous block of ceil(rows / n) rows, as torch.chunk and DTensor's Shard(0) split
    them (launcher/tables/partition.py), with that block's optimizer states: one copy per job."""
    alias: str = ""
    """The table's other name placement.tables / tables take (a TorchRec table's own name); '' = none."""
    hash_buckets: int = 0
    """tables.<name>.hash: raw ids are hashed into this many rows inside the lookup (0 = ids are rows)."""
    hash_fn: str = "mix"
    """tables.<name>.hash_fn: mix or mod (launcher/tables/hashing.py)."""
    built: str = "whole"
    """With shards > 1, how a rank gets its block: whole (the recipe builds the table, the rank copies its block out
    and frees it; a host's ranks take turns) or blocks (the table is made on the meta device and each rank replays
    its initialisation on its own rows only: launcher/tables/block_init.py). placement.ps_init decides."""

    @property
    def outside(self) -> bool:
        """Trained outside the parallel parts, in a table store (on the host or the device); False: trained with
        the rest of the model by the parts (location engine)."""
        return self.location != "engine"

    @property
    def on_host(self) -> bool:
        """In host memory: the table, its lookups' gathers and its optimizer states."""
        return self.location == "host"

    @property
    def sharded(self) -> bool:
        """Its rows split over the ranks of its group (parameter-server mode); False: each holder has a whole copy."""
        return self.shards > 1


@dataclass(frozen=True)
class DenseSettings:
    """The dense network's optimizer as a table with no tables.<path> entry follows it: a recipe's optimizer.*, or in
    runtime.prepare() your torch optimizer's class and the param group that held the table."""

    name: str
    """A DENSE_OPTIMIZERS name (sgd, momentum, adam, adamw), or the class of one that is none of them (Adagrad)."""
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    betas: tuple[float, float] | None = None
    """Adam's (beta1, beta2); None: the optimizer has none."""
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled_decay: bool = False
    """AdamW's decoupled weight decay (else L2, as torch's SGD and Adam)."""


@dataclass(frozen=True)
class PlacementPlan:
    tables: tuple[TablePlan, ...]
    sparse_tables: bool
    """True: tables train outside the parallel parts (in a table store) with their sparse optimizers."""
    dense_params: int
    """Parameters the parallel parts train (tables included when they are dense)."""
    param_location: str
    """device, or host (ZeRO-3 offload_param)."""
    optimizer_location: str
    """device, or host (ZeRO-Offload offload_optimizer)."""
    cpu_impl: str
    """With the optimizer on the host: torch or deepspeed (DeepSpeedCPUAdam)."""
    pin_memory: bool
    prefetch: int = 0
    """Micro-batches whose host-table rows are gathered ahead (placement.prefetch); 0 = when the forward asks."""
    prefetch_words: str = ""
    """How the tables are looked up, for the plan: what prefetch covers, or why it does not apply."""
    kernels_words: str = ""
    """What the host tables' gathers, gradient coalesces and optimizer updates run on (HostFacts.table_kernels)."""
    modules: tuple[ModulePlan, ...] = ()
    """Dense modules on the host (placement.modules; launcher/plan/host_modules.py), outside dense_params."""

    @property
    def offload(self) -> bool:
        """The optimizer or the parameters live on the host (ZeRO-Offload): only DeepSpeed does that."""
        return self.optimizer_location == "host" or self.param_location == "host"
