"""The frozen results of planning, the small protocol the launch side needs of any of them, and the host facts
planning takes as input."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from launcher.codec import from_plain
from launcher.plan.intents import PartPlan
from launcher.plan.batch import BatchPlan
from launcher.plan.budget import Budget
from launcher.plan.memory import MemoryEstimate
from launcher.plan.peak import MemoryPlan
from launcher.plan.parallel import ParallelDims
from launcher.plan.pipeline import PipelinePlan
from launcher.plan.placement import PlacementPlan
from launcher.plan.ranks import RankPlan
from launcher.plan.sharding import ShardingPlan


@dataclass(frozen=True)
class HostFacts:
    """What the launcher found out about this host (probed in launch/host.py, never inside the plan)."""

    hostname: str
    cpu_count: int
    accelerators: int
    """Visible CUDA devices; 0 on a CPU-only host."""
    extensions_dir: str
    """Where DeepSpeed's JIT-built C++ ops are cached (TORCH_EXTENSIONS_DIR)."""
    toolchain_path: str = ""
    """PATH for building those ops and for the ranks (launch.host.toolchain_path); "" = the launcher's own PATH."""
    notes: tuple[str, ...] = ()
    """What the probe could not settle and the user should hear (e.g. NVIDIA devices torch cannot see)."""
    host_memory: int = 0
    """Bytes of memory this host has for the run: RAM, or the cgroup's limit when lower; 0 = unknown."""
    device_memory: int = 0
    """Bytes of memory of one accelerator (the smallest visible one); 0 = none or unknown."""
    omp_threads: str = ""
    """OMP_NUM_THREADS of the launcher's environment ("" = unset): the ranks keep it, as torchrun does."""
    table_kernels: str = ""
    """What host tables' gathers, coalesces and updates run on here, and the pages under them, in words
    (launcher.native.choice and pages_choice): the C kernels, or torch's ops and why; huge pages or not, and why."""
    table_fbgemm: str = ""
    """Where fbgemm_gpu is installed, why tables whose optimizer FBGEMM also has do not run on its kernels, in words
    (launcher.native.fbgemm_choice); "" = it is not installed."""
    malloc_libs: tuple[tuple[str, str], ...] = ()
    """(name, path) of each allocator a rank could preload that this host has (launcher/facts/malloc.py)."""
    preload: str = ""
    """LD_PRELOAD of the launcher's environment: the ranks inherit it."""
    malloc_vars: tuple[str, ...] = ()
    """glibc's malloc variables set in the launcher's environment (MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES, ...)."""


class RunPlan(Protocol):
    """What launching needs of a plan, whatever runs in the ranks (a recipe's Trainer or a user's script)."""

    kind: str
    """recipe or script."""
    name: str
    """Run-id prefix: the recipe's name, or 'script'."""
    world_size: int
    nproc_per_node: int
    steps: int
    """Steps the ranks report progress for; 0 = they report none (a script)."""
    ranks: tuple[RankPlan, ...]
    rank_table: dict[str, Any]
    ds_ops: tuple[str, ...]
    notes: tuple[str, ...]

    def rank_args(self, run_dir: str) -> tuple[str, ...]:
        """Arguments of ``python`` for every rank."""

    def to_dict(self) -> dict[str, Any]:
        """plan.json."""


@dataclass(frozen=True)
class OptimizerPlan:
    name: str
    lr: float
    momentum: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    target: str
    """device or cpu."""


@dataclass(frozen=True)
class EarlyStopPlan:
    """trainer.early_stop as the ranks apply it (launcher/worker/early_stop.py): the metric watched on the validation
    split, whether lower or higher is better, and how many validations without improvement stop the run."""

    metric: str
    mode: str
    """min or max (auto resolved)."""
    patience: int
    min_delta: float


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher and the ranks need to know, decided before any process exists. The worker reads only
    this (plan.json): the resolved model, data and loss specs are in it."""

    recipe: str
    dims: ParallelDims
    """dp × pp × tp = world_size."""
    parts: tuple[PartPlan, ...]
    """The parallel parts, in the order a rank applies them (launcher.parallel)."""
    world_size: int
    nnodes: int
    nproc_per_node: int
    zero_stage: int
    backend: str
    device_type: str
    """cpu or cuda."""
    precision: str
    steps: int
    log_every: int
    checkpoint_every: int
    eval_every: int
    eval_batches: int
    eval_metrics: str
    seed: int
    batch: BatchPlan
    optimizer: OptimizerPlan
    placement: PlacementPlan
    memory: MemoryEstimate
    model: dict[str, Any]
    """The model's kwargs with its ``_target_``, data facts applied."""
    data: dict[str, Any]
    """The data source's kwargs with its ``_target_``."""
    loss: dict[str, Any]
    """The loss's ``_target_`` (and kwargs)."""
    reference: dict[str, float]
    """Numbers the data knows a trained model is measured against (e.g. entropy_floor, uniform_loss)."""
    ranks: tuple[RankPlan, ...]
    rank_table: dict[str, Any]
    ds_ops: tuple[str, ...]
    """DeepSpeed C++ ops the ranks will load (JIT-built once per machine)."""
    notes: tuple[str, ...]
    """Decisions the planner made for the user, in words (e.g. how nproc_per_node=auto resolved)."""
    resume_from: str = ""
    """A checkpoint dir (<run>/checkpoints/step<N>) every rank loads before training; empty = start fresh."""
    eval_max_batches: int = 0
    """Cap on held-out micro-batches per rank of a finite held-out set; 0 = all."""
    smoke: bool = False
    """A smoke run: the final checkpoint is read back and checked against the trainer's state."""
    recompute: tuple[str, ...] = ()
    """Layers (names of the recipe's layers()) run under activation checkpointing."""
    activations: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Estimated bytes kept for the backward per micro-batch: per_layer, kept_bytes (no recompute),
    kept_bytes_with_recompute; {} when not estimated (only runs that recompute or pipeline are)."""
    pipeline: PipelinePlan | None = None
    """The stages of a pipeline (the pipeline part); None without one."""
    code_paths: tuple[str, ...] = ()
    """Folders of the user's code (a recipe in their folder): put on sys.path in every rank before building."""
    debug_fail: tuple[int, int] = (-1, -1)
    """(rank, step) where a rank raises on purpose, for testing supervision; (-1, -1) = off."""
    sharding: ShardingPlan | None = None
    """Op-level sharding / tensor parallel: per operator its strategy, shapes and collectives; None = none."""
    model_output: str = "auto"
    """What of the model's output the loss and evaluation take (launcher.usercode.items.select_output)."""
    loggers: tuple[dict[str, Any], ...] = ()
    """Rank 0's metric loggers, each a ``_target_`` spec (launcher.loggers); () = none."""
    peak: MemoryPlan | None = None
    """The memory model: one rank's terms at its peak, and its host's (launcher/plan/peak.py)."""
    budget: Budget | None = None
    """What one device and one host may hold (launcher/plan/budget.py)."""
    decisions: tuple[str, ...] = ()
    """placement=auto: each decision with its reason and the runner-up; () otherwise."""
    auto: dict[str, Any] = dataclasses.field(default_factory=dict)
    """placement=auto: the keys it chose (as overrides); {} otherwise."""
    val_every: int = 0
    """Score the validation split every this many steps (and at the last step); 0 = no validation split."""
    early_stop: EarlyStopPlan | None = None
    """trainer.early_stop; None = the run goes on to ``steps``."""
    warm_start: bool = False
    """The ranks are forked from a forkserver that imported torch and the worker once (launcher.warm_start on a CPU
    plan: launcher/backends/warm_start.py); False = each rank is a fresh ``python -m launcher.worker``."""
    kind: str = "recipe"

    @property
    def name(self) -> str:
        return self.recipe

    @property
    def engine(self) -> str:
        """The parts, in words (tensor_parallel+recompute+fsdp+pipeline): for reports, never compared."""
        return "+".join(p.name for p in self.parts)

    def rank_args(self, run_dir: str) -> tuple[str, ...]:
        return ("-m", "launcher.worker", run_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaunchPlan:
        """plan.json read back (the field types say how: launcher/codec.py)."""
        return from_plain(cls, d)


@dataclass(frozen=True)
class ScriptPlan:
    """A user's own torch.distributed script on every rank, with torchrun's environment: ranks, env, rank table."""

    script: str
    args: tuple[str, ...]
    world_size: int
    nnodes: int
    nproc_per_node: int
    backend: str
    """The backend a recipe run would use; informational: the script picks its own in init_process_group."""
    device_type: str
    ranks: tuple[RankPlan, ...]
    rank_table: dict[str, Any]
    notes: tuple[str, ...]
    runtime: dict[str, Any] | None = None
    """What the script's ``runtime.prepare()`` builds (launcher.plan.script.RuntimePlan as a dict)."""
    loggers: tuple[dict[str, Any], ...] = ()
    """Rank 0's metric loggers, which runtime.log feeds (launcher.loggers); () = none."""
    kind: str = "script"
    name: str = "script"
    steps: int = 0
    ds_ops: tuple[str, ...] = ()
    uses: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What the script trains with (launcher.integrations.ScriptUse: kind prepare/accelerate/plain, why, trainer)
    and ``handover``: the accelerate variables each rank's env got (the values are in rank_env.json)."""
    not_applied: tuple[dict[str, str], ...] = ()
    """Keys set that nothing in this job reads ({key, value, why}): shown in the plan and the summary."""

    def rank_args(self, run_dir: str) -> tuple[str, ...]:
        """``python script.py args`` through ``launcher.worker.script``: the same run, and a rank whose work is done
        ends with the script's own exit code (no gloo teardown abort)."""
        return ("-m", "launcher.worker.script", self.script, *self.args)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
