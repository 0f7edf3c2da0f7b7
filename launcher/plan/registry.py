"""One registry per kind of option: name -> what the plan, the memory estimate, the DeepSpeed emitter and the worker
need to know about it. Torch-free: the worker imports the classes named here by their dotted path. (The parallel
parts have their own registry: launcher/parallel/registry.py.)

An unknown name is a plan-time error with a did-you-mean (``unknown``), never a silent fallback."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launcher.errors import did_you_mean


@dataclass(frozen=True)
class DenseOptimizer:
    """An optimizer of the dense network (inside the engine)."""

    impl: str
    """Dotted path of the torch optimizer class."""
    kwargs: tuple[str, ...]
    """Which OptimizerPlan fields it takes (lr, momentum, betas, eps, weight_decay)."""
    state_floats: int
    """fp32 state values per parameter (Adam: exp_avg + exp_avg_sq = 2)."""
    fused: bool
    """Construct with fused=True (one kernel per step; 3.4x torch's foreach Adam on this CPU)."""
    zero_tested: bool
    """DeepSpeed's ZeRO has tested it as a client optimizer (else zero_allow_untested_optimizer is emitted)."""
    ds_cpu_adam: bool
    """optimizer.cpu_impl=deepspeed can run it (DeepSpeedCPUAdam: Adam or AdamW)."""
    sparse_grads: bool = False
    """The torch class takes sparse gradients (an nn.Embedding(sparse=True) trained inside the parts)."""


DENSE_OPTIMIZERS: dict[str, DenseOptimizer] = {
    "sgd": DenseOptimizer("torch.optim.SGD", ("lr", "weight_decay"), 0, False, False, False, True),
    # MindSpore's Momentum: v = m*v + g; p -= lr*v (torch SGD with dampening 0)
    "momentum": DenseOptimizer("torch.optim.SGD", ("lr", "momentum", "weight_decay"), 1, False, False, False, True),
    "adam": DenseOptimizer("torch.optim.Adam", ("lr", "betas", "eps", "weight_decay"), 2, True, True, True),
    "adamw": DenseOptimizer("torch.optim.AdamW", ("lr", "betas", "eps", "weight_decay"), 2, True, True, True),
}


def unread_optimizer_keys(name: str, table_optimizers: Iterable[str] = ()) -> list[str]:
    """The optimizer.* hyper-parameters dense optimizer ``name`` does not take (the others' kwargs less its own):
    set, they would change nothing. momentum stays read where a table trains with the momentum row optimizer, which
    takes its factor from optimizer.momentum (launcher/plan/placement.py)."""
    spec = DENSE_OPTIMIZERS.get(name)
    if spec is None:
        return []
    keys = {k for s in DENSE_OPTIMIZERS.values() for k in s.kwargs} - set(spec.kwargs)
    if "momentum" in table_optimizers:
        keys.discard("momentum")
    return sorted(keys)


@dataclass(frozen=True)
class TableOptimizer:
    """How an embedding table trains."""

    impl: str
    """Dotted path of the row-sparse optimizer class (launcher.tables.sparse_optim); '' = inside the engine."""
    kwargs: tuple[str, ...]
    """Which TablePlan fields it takes, in its constructor's order after the weight."""
    state_floats: int
    """fp32 state values per table value."""
    twin_of: tuple[str, ...] = ()
    """The dense optimizers (DENSE_OPTIMIZERS names) it stands for: a table with no ``tables.<path>`` entry of a
    model trained with one of them gets this one (launcher/plan/placement.py says how it differs)."""
    shardable: bool = True
    """Its state is per row in the table store, so parameter-server mode (placement.ps) can split it with the rows;
    torch's SparseAdam keeps its state over the whole weight, and a dense table is the engine's."""
    row_floats: int = 0
    """fp32 state values per row besides (row-wise Adagrad's one sum a row)."""
    fbgemm: str = ""
    """FBGEMM's optimizer of the same update (its EmbOptimType), '' = none: where fbgemm_gpu is installed, the plan
    says why such a table's update stays on the store's kernels (launcher/plan/prefetch.py kernels_words)."""

    @property
    def sparse(self) -> bool:
        """Trains outside the engine, on the rows of each batch only."""
        return bool(self.impl)

    def state_bytes(self, rows: int, dim: int) -> int:
        """Bytes of the optimizer's states for ``rows`` rows of ``dim`` values."""
        return 4 * rows * (dim * self.state_floats + self.row_floats)


def table_state_bytes(optimizer: str, rows: int, dim: int) -> int:
    """Bytes of table optimizer ``optimizer``'s states for rows x dim (0 for a name the registry lacks)."""
    return TABLE_OPTIMIZERS[optimizer].state_bytes(rows, dim) if optimizer in TABLE_OPTIMIZERS else 0


_SGD = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
TABLE_OPTIMIZERS: dict[str, TableOptimizer] = {
    "lazy_adam": TableOptimizer("launcher.tables.sparse_optim.LazyAdam",  # m and v
                                ("lr", "betas", "eps", "weight_decay", "decoupled_decay"), 2, ("adam", "adamw")),
    "sparse_adam": TableOptimizer("launcher.tables.sparse_optim.SparseAdam", ("lr", "betas", "eps"), 2,
                                  shardable=False),
    "ftrl": TableOptimizer("launcher.tables.sparse_optim.SparseFTRL",
                           ("lr", "l1", "l2", "lr_power", "initial_accumulator"), 2),  # accumulator + linear
    "sgd": TableOptimizer("launcher.tables.sparse_optim.SparseSGD", _SGD, 0, ("sgd",), fbgemm="EXACT_SGD"),
    "momentum": TableOptimizer("launcher.tables.sparse_optim.SparseSGD", _SGD, 1, ("momentum",)),  # the buffer
    "adagrad": TableOptimizer("launcher.tables.sparse_optim.SparseAdagrad",
                              ("lr", "eps", "weight_decay", "initial_accumulator"), 1,  # the sum of squares
                              fbgemm="EXACT_ADAGRAD"),
    "rowwise_adagrad": TableOptimizer("launcher.tables.sparse_optim.RowwiseAdagrad",
                                      ("lr", "eps", "weight_decay", "initial_accumulator"), 0, row_floats=1,
                                      fbgemm="EXACT_ROWWISE_ADAGRAD"),
    # a dense table is a parameter of the engine; its state is optimizer.name's
    "dense": TableOptimizer("", (), 0, shardable=False),
}


@dataclass(frozen=True)
class CpuOptimizer:
    """optimizer.cpu_impl: what steps the dense optimizer when it lives on the host (optimizer.target=CPU)."""

    impl: str
    """Dotted path of the class; '' = the dense optimizer's own torch class (DENSE_OPTIMIZERS)."""
    op: str
    """The DeepSpeed C++ op it JIT-loads ('' = none)."""
    flat_partitions: bool
    """It steps DeepSpeed's flat fp32 partitions only (the deepspeed part's offload), not DTensor shards."""


CPU_OPTIMIZERS: dict[str, CpuOptimizer] = {
    "torch": CpuOptimizer("", "", False),  # torch's fused CPU kernel: as fast here, no JIT build (performance.md P3)
    "deepspeed": CpuOptimizer("deepspeed.ops.adam.DeepSpeedCPUAdam", "cpu_adam", True),
}


HASH_FUNCTIONS = ("mix", "mod")
"""What tables.<name>.hash_fn may name (launcher/tables/hashing.py): splitmix64's mixer then the remainder, or the
remainder alone."""


def unknown(key: str, value: str, known: Mapping[str, object] | tuple[str, ...]) -> str:
    """'key=value is not one of ...' with a did-you-mean, for any registry."""
    names = list(known)
    hint = did_you_mean(str(value), names, f"{key}=")
    return f"{key}={value} is not one of {', '.join(names)}.{hint}"
