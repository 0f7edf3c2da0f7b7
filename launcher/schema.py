"""Typed schema of a hetero-launch config, registered in Hydra's ConfigStore.

One dataclass per section. A recipe YAML (``conf/recipe/<name>.yaml``) fills these sections in; the recipe's own
model and data schemas live beside its code in ``recipes/<name>/__init__.py`` and are registered here too, so every
key a user can type is typed and known before anything runs.

Sentinels: ``-1`` means "infer it" wherever a field says so; ``"auto"`` means "decide from the host".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class RecipeConfig:
    name: str = MISSING
    """Name of the recipe; also the run-id prefix."""


@dataclass
class TargetConfig:
    """A Hydra-instantiable object: ``_target_`` is a dotted import path."""

    _target_: str = MISSING


@dataclass
class OptimizerConfig:
    name: str = "adam"
    """One of: sgd, momentum (MindSpore's Momentum = SGD with momentum), adam, adamw."""
    lr: float = 1e-3
    """Learning rate."""
    momentum: float = 0.0
    """Momentum factor for sgd/momentum, in [0, 1)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's (beta1, beta2)."""
    eps: float = 1e-8
    """Adam's epsilon."""
    weight_decay: float = 0.0
    """L2 (sgd/adam) or decoupled (adamw) weight decay."""
    target: str = "device"
    """Where the dense optimizer and its fp32 states live: device, or CPU (zero.stage=0 becomes 2): DeepSpeed's
    ZeRO-Offload on plain data parallelism; with tensor parallel or pipeline stages FSDP2's CPUOffloadPolicy, which
    keeps the fp32 parameters and their gradients on the host too (each layer's parameters come to the device to
    compute)."""
    cpu_impl: str = "torch"
    """With target=CPU: torch (torch.optim, fused kernel, no JIT build) or deepspeed (DeepSpeedCPUAdam, adam/adamw)."""


@dataclass
class TableConfig:
    """How one embedding table trains. Tables with a sparse optimizer train outside the parallel parts, in a table
    store (launcher/tables/)."""

    optimizer: str = "lazy_adam"
    """lazy_adam (row-fused lazy Adam), sparse_adam (the same algorithm by torch.optim.SparseAdam, slower),
    ftrl (FTRL-Proximal), or dense (with the rest of the model, by the parallel parts, with optimizer.name)."""
    lr: float = 1e-3
    """Learning rate of the table's optimizer."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """lazy_adam's / sparse_adam's (beta1, beta2)."""
    eps: float = 1e-8
    """lazy_adam's epsilon."""
    l1: float = 0.0
    """ftrl's L1 strength."""
    l2: float = 0.0
    """ftrl's L2 strength."""
    lr_power: float = -0.5
    """ftrl's learning-rate power (<= 0; -0.5 = 1/sqrt schedule)."""
    initial_accumulator: float = 0.1
    """ftrl's starting squared-gradient accumulator (> 0)."""
    hash: int = 0
    """Raw ids -> rows inside the table's lookup: 0 = the ids are rows (0 .. rows-1, as nn.Embedding takes them);
    n > 0 = every id (any int64: hashed 32/64-bit feature ids) is hashed into the table's first n rows (n <= its
    rows), so the model and its data keep raw ids. Needs the table outside the parts (a sparse optimizer)."""
    hash_fn: str = "mix"
    """With hash > 0: mix (splitmix64's 64-bit mixer, then the remainder by hash) or mod (the id's remainder by
    hash: TorchRec's convention for Criteo)."""


@dataclass
class LoaderConfig:
    """The DataLoader of a recipe in your folder (its ``data``/``eval_data`` are the Datasets' own ``_target_``)."""

    collate_fn: Any = None
    """How a micro-batch's items become one batch: null = torch's default_collate; a function by dotted path
    (my_project.data.collate, or {_target_: my_project.data.collate}); {_target_: fn, key: value, ...} binds those
    keyword arguments (Hydra's _partial_); {_target_: SomeClass, ...} builds a callable object. It may return a tuple
    (input_1, ..., input_k, label), a dict of keyword inputs and a label, or an object with them as attributes (a
    dataclass such as TorchRec's Batch: name them with data_inputs and data_label); inputs may be any tensors or
    structures of them (TorchRec's KeyedJaggedTensor)."""
    num_workers: Any = "auto"
    """DataLoader worker processes per rank that read and collate micro-batches ahead of the step: auto = none when a
    micro-batch's items read in under a millisecond (measured before launch: a worker's hand-over would cost more than
    it saves), else one per CPU core a rank has beyond its own, at most 4; or a number >= 0."""
    pin_memory: Any = "auto"
    """Page-locked batches for faster, asynchronous copies to the GPU: auto = on with CUDA, off on the CPU."""
    prefetch_factor: Any = None
    """Micro-batches each worker reads ahead: null = torch's default (2); needs num_workers > 0."""
    persistent_workers: Any = "auto"
    """Keep the workers between epochs (and evaluations): auto = yes when there are workers."""


@dataclass
class TrainerConfig:
    steps: int = 100
    """Optimizer steps (each = grad_accum micro-batches on every data-parallel rank)."""
    epochs: float = 0
    """If > 0: train this many passes over the data instead of trainer.steps (needs a data set of known size)."""
    log_every: int = 10
    """Write a metrics.jsonl line every this many steps (the first and last step are always logged)."""
    seed: int = 1234
    """Seed for model init and data order; identical on every rank."""
    checkpoint_every: int = 0
    """Save a checkpoint (log_output/<run>/checkpoints/step<N>) every N steps; 0 = only at the end; -1 = never."""
    checkpoint_dir: str = ""
    """Where the run's checkpoints go instead of <run dir>/checkpoints (which then links there); empty = the run dir.
    cluster.launch=elastic with launcher.max_restarts > 0 on several hosts needs one that every host reads and writes
    (a shared file system): a restart resumes from every rank's shards, a lost host's too. One job's own folder: a new
    elastic job refuses one that holds checkpoints already (resume them with trainer.resume_from)."""
    resume_from: str = ""
    """A checkpoint dir to continue from (e.g. log_output/<run>/checkpoints/step100): model, optimizer, tables and
    their states, data position and RNG are loaded, training goes on to trainer.steps. Empty = start fresh."""
    resume: str = ""
    """A run to continue: its run dir (log_output/<run>) or latest (output.log_dir's newest run). The new run starts
    from the old run's newest complete checkpoint, in a new run dir. Empty = start fresh (or trainer.resume_from)."""
    grad_clip: float = 0.0
    """Clip the global L2 norm of the dense gradients to this before each optimizer step; 0 = off. ddp and fsdp:
    one norm over every parameter of every stage (DTensor shards included), as torch's clip_grad_norm_; deepspeed:
    its gradient_clipping. Tables trained outside the parts are not clipped (the plan says so)."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate every N steps as well as at the end; 0 = only at the end."""
    batches: int = 4
    """Held-out global micro-batches per evaluation for endless (synthetic) data; a data set with a test split
    evaluates all of it. 0 = no evaluation."""
    max_batches: int = 0
    """Cap on the held-out micro-batches per rank and evaluation, for any held-out data (0 = no cap); smoke runs
    use 2."""
    metrics: str = "auto"
    """loss (mean loss); binary: loss + AUC, log loss, accuracy (and bayes_auc when the data knows the truth);
    auto: binary when the labels seen before the run are all 0/1, else loss."""


@dataclass
class BatchConfig:
    global_size: int = -1
    """Samples per optimizer step over all ranks; -1 = infer (global = micro x grad_accum x dp)."""
    micro_size: int = -1
    """Samples per forward/backward on one rank; -1 = infer."""
    grad_accum: int = -1
    """Micro-batches accumulated per step; -1 = infer (1 when only one size is given)."""
    micro_batches: int = -1
    """A pipeline's micro-batches per optimizer step (M of its schedule): grad_accum by the name pipelines use; when
    set (not -1) it sets grad_accum."""


@dataclass
class ParallelConfig:
    dp: int = -1
    """Data-parallel degree; -1 = world_size / (pipeline_stages x tp). dp x pipeline_stages x tp = world_size."""
    pipeline_stages: int = 1
    """Pipeline stages P over the pp dim of the mesh (torch.distributed.pipelining); 1 = no pipeline."""
    stages: dict[str, int] = field(default_factory=dict)
    """MindSpore's cell.pipeline_stage in YAML: each of the recipe's layers() -> its stage (0 .. P x stages_per_rank
    - 1, in forward order), e.g. {head: 0, layer1: 0, layer2: 0, layer3: 1, layer4: 1, fc: 1}; empty =
    parallel.partition decides."""
    partition: str = "parameters"
    """With parallel.stages empty: parameters (contiguous stages balancing their parameter counts) or uniform (the
    same number of layers per stage)."""
    schedule: str = "1f1b"
    """A pipeline's schedule: 1f1b (one forward, one backward in the steady state; with fewer micro-batches than
    stages it is GPipe, and runs as gpipe), gpipe (every forward, then every backward) or interleaved_1f1b
    (parallel.stages_per_rank >= 2 stages per rank, looped: a smaller bubble)."""
    stages_per_rank: int = 1
    """Virtual stages per pipeline rank (interleaved_1f1b): stage s runs on pipeline rank s mod P."""
    tp: int = 1
    """Tensor-parallel degree: with tp > 1 and no sharding, the recipe's tensor-parallel plan (gpt: Megatron-style
    column/row-split attention and MLP) runs on the mesh's tp dim; its ranks share one replica and see the same data."""
    sharding: dict[str, Any] = field(default_factory=dict)
    """Op-level sharding in MindSpore's notation, operator -> strategy: {fc1: [[2, 4], [4, 1]]} splits fc1's x
    (batch, in) 2 × 4 and its w (in, out) 4 × 1. The batch factor is dp, the rest tp; every strategy's factors multiply
    to the ranks of one pipeline stage (world_size / pipeline_stages). Operators are named by module path (fc1) or
    MindSpore-style by kind and order (matmul, matmul_1). Empty = none."""
    search_mode: str = "sharding_propagation"
    """How operators without a strategy get one: sharding_propagation (each takes its input's layout)."""
    data_parallel: str = "auto"
    """The part that runs data parallelism over the dp dim: ddp (replicated fp32 parameters, torch DDP), fsdp
    (torch FSDP2: sharded parameters, gradients and optimizer states, bf16 master weights, CPU offload; composes
    with tensor parallel and pipelines), deepspeed (DeepSpeed ZeRO 0-3 and ZeRO-Offload; plain data parallelism
    only), or auto: chosen from zero.stage, optimizer.target, placement.offload_params, precision and the layout
    (the plan says which and why)."""
    sync_batchnorm: bool = False
    """Every BatchNorm normalises over the dp group's whole micro-batch, as one process does (torchvision's --sync-bn):
    the sync_batchnorm part (launcher/parallel/sync_batchnorm.py). Refused with dp 1 and on a model without one."""


@dataclass
class ZeroConfig:
    stage: int = 0
    """ZeRO stage 0-3: 0 = plain data parallel, 1 = shard optimizer states, 2 = + gradients, 3 = + parameters. On
    DeepSpeed exactly so; on FSDP2 (with tensor parallel or pipeline stages) 1-3 shard the parameters too, and 1 and 2
    keep each layer's gathered parameters from its forward to its backward."""


@dataclass
class DeepSpeedSection:
    config: Any = None
    """Your DeepSpeed config, merged with the one hetero-launch compiles: a JSON file's path (deepspeed.config=
    ds_config.json) or a mapping (inline YAML). Keys hetero-launch does not model pass through to DeepSpeed; a key
    it models (ZeRO stage, offload, bf16/fp16, batch sizes, gradient_clipping, optimizer) becomes the intent when
    our key is not set, and must agree with it when it is (README "Bring your DeepSpeed config"). null = none."""
    given: list[str] = field(default_factory=list)
    """Set by the launcher: the keys the command line gave (a file's value never replaces those)."""
    source: str = ""
    """Set by the launcher: the file deepspeed.config was read from ("" = inline)."""


@dataclass
class PlacementConfig:
    host_device_mix: int = 0
    """1 = every embedding table with a sparse optimizer lives on the host (looked up and updated there);
    0 = on the device. The dense network trains where the parallel parts put it (optimizer.target,
    placement.offload_params)."""
    offload_params: bool = False
    """ZeRO-3 parameter offload (offload_param: device cpu); needs zero.stage=3."""
    ps: bool = False
    """Parameter-server mode for every table that trains outside the parts: its rows split over the ranks' host memory
    (each rank of the table's pipeline stage owns one contiguous block of ceil(rows / ranks) rows and their optimizer
    states), one copy per job instead of one per rank; placement.tables.<name> may still name another place for one
    table. Needs a row-sparse table optimizer (lazy_adam, ftrl, sgd, momentum)."""
    ps_init: str = "auto"
    """How each rank gets its block of a split table: whole (the model is built as written, tables whole, and each
    rank keeps its block: the same initial values as without ps; a host's ranks take turns, so a host holds at most
    one whole copy at a time), blocks (the tables are made on the meta device and each rank replays their
    initialisation on its own rows, with random draws seeded per 65,536-row chunk: no table is ever whole, so a table
    larger than a host trains; other initial values than a whole build's), or auto: whole when that fits the host
    budget, else blocks."""
    tables: dict[str, str] = field(default_factory=dict)
    """Per-table override of host_device_mix and ps: <table name> -> host (a whole copy on each rank's host), device
    (a whole copy on each rank's device) or ps (rows split over the ranks' host memory, as placement.ps)."""
    pin_memory: str = "auto"
    """Page-locked host buffers for offload and transfers: auto (true with CUDA), true, false."""
    prefetch: Any = "auto"
    """Micro-batches drawn ahead whose host-table rows a background thread gathers while the current one steps
    (tables with a copy on each rank's host), after each step's writes of the rows they need: 0 = each table looked
    up when the forward asks; 1-8; auto = 0 for now (measured no faster on CPU ranks with no core to spare, not yet run
    on a GPU: the plan says why)."""
    mode: str = "manual"
    """manual: the intents above decide; auto (``placement=auto``): the planner chooses where each table lives, the
    dense optimizer's and parameters' offload, the ZeRO stage and the recompute set so that every device and host fits
    its budget (cluster.device_memory_gb, cluster.host_memory_gb, less placement.reserve) at the least estimated step
    time; the plan says each decision, its reason and the runner-up."""
    reserve: float = 0.1
    """Share of each memory budget kept free (fragmentation, what the model does not see), in [0, 1): 0.1 = plan to
    90 %."""


@dataclass
class ClusterConfig:
    launch: str = "local"
    """How ranks are started: local (this host's ranks, the launcher hosts the rendezvous store); elastic (several
    hosts: run the same command on each; they meet on torch elastic's c10d rendezvous at cluster.rdzv_endpoint and
    get their node ranks there, as with torchrun --rdzv-backend=c10d); mpi (one launcher runs the ranks under
    OpenMPI's mpirun, on the hosts of cluster.hostfile); slurm (inside an allocation: the ranks run under srun; a dry
    run writes job.sbatch for sbatch)."""
    launcher_args: list[str] = field(default_factory=list)
    """cluster.launch=mpi|slurm: extra arguments for mpirun or srun, one list item each (never through a shell),
    e.g. [--mca,btl_tcp_if_include,eth0]."""
    nnodes: Any = 1
    """Number of hosts; more than 1 needs cluster.launch=elastic, mpi (with cluster.hostfile) or slurm. With
    cluster.launch=elastic also MIN:MAX (torchrun's --nnodes=MIN:MAX): the job runs on MIN to MAX hosts, planned for
    MAX; with launcher.max_restarts > 0 it restarts on the hosts left when one is lost, and admits a host that joins
    later, planning again for each world (global batch kept) from the newest checkpoint."""
    node_rank: int = 0
    """This host's index among nnodes (local: 0; elastic: assigned at the rendezvous, this key is not used)."""
    rdzv_endpoint: str = ""
    """cluster.launch=elastic: host:port of the c10d rendezvous, the same on every host (a host that is one of the
    nodes; the first node there to start hosts it)."""
    rdzv_id: str = "hetero-launch"
    """cluster.launch=elastic: the rendezvous' name, the same on every host of one job (two jobs on one endpoint
    need two ids)."""
    rdzv_conf: dict[str, int] = field(default_factory=dict)
    """cluster.launch=elastic: torch's c10d rendezvous settings, as torchrun's --rdzv-conf: last_call_timeout (s a
    round waits for more hosts once MIN are there; torch's default 30), keep_alive_interval (s between a launcher's
    heartbeats; 5), keep_alive_max_attempt (missed heartbeats before a host counts as lost; 3), close_timeout (30).
    Empty = torch's defaults."""
    rdzv_timeout_s: float = 300.0
    """cluster.launch=elastic: how long the hosts wait for every node to join; then the run stops, saying who came."""
    local_addr: str = ""
    """cluster.launch=elastic: this host's address as the other hosts reach it; empty = its fully qualified name."""
    nproc_per_node: str = "auto"
    """Ranks on this host: a positive integer, or auto = one per visible accelerator, 2 on a CPU-only host."""
    master_addr: str = "127.0.0.1"
    """Address of the rendezvous store (rank 0's host)."""
    master_port: int = 0
    """Port of the rendezvous store; 0 = a free port picked at launch."""
    device_memory_gb: float = 0.0
    """Memory of one accelerator in GB (10^9 bytes); 0 = what the host reports (on a CPU-only host the ranks' share
    of host memory: there the device is host memory)."""
    host_memory_gb: float = 0.0
    """Memory of one host in GB (10^9 bytes), shared by its ranks and the launcher; 0 = what the host reports (its
    RAM, or the container's cgroup limit when lower)."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl with accelerators, else gloo), gloo or nccl."""
    device: str = "auto"
    """Where ranks compute: auto (cuda with visible CUDA devices, else cpu), cpu (also on a GPU host), or cuda."""
    # A cluster described in a file (read in launcher/backends/cluster_files.py); give at most one.
    rank_table_file: str = ""
    """A MindSpore/HCCL rank table (JSON, version 1.0, as hccl_tools.py writes it): servers, devices, rank ids.
    Empty = none."""
    hostfile: str = ""
    """A DeepSpeed-style hostfile: one `<host> slots=<N>` line per host, # comments. Empty = none."""
    include: str = ""
    """With hostfile: only these hosts/slots, DeepSpeed's --include syntax (worker-0@worker-1:0,2). Empty = all."""
    exclude: str = ""
    """With hostfile: all but these hosts/slots, DeepSpeed's --exclude syntax (worker-1:0). Empty = none excluded;
    not together with include."""


@dataclass
class OutputConfig:
    log_dir: str = "log_output"
    """Where run dirs go, relative to the directory the command runs in."""
    run_name: str = ""
    """Run dir name; empty = <recipe>-<YYYYmmdd-HHMMSS>. An existing run dir is never overwritten."""
    stderr_tail: int = 20
    """Lines of a failed rank's stderr printed by the launcher."""
    console: str = "rank0"
    """A script= run's output on the launcher's terminal as it runs (torchrun's --tee): rank0 = rank 0's stdout and
    stderr lines, all = every rank's, each line prefixed [rank N], none = nothing. Either way every rank's output is
    written in full to rank.N/{stdout,stderr}; a line over 4 KiB is cut on the terminal with a marker. A recipe's
    ranks report through the progress view and the failure report instead: their output stays in rank.N/."""


@dataclass
class LauncherConfig:
    watchdog_s: float = 300.0
    """A rank whose heartbeat (finished steps, evaluation batches) has not moved for this long, or for 10 of its
    slowest steps if that is longer, is stalled: the launcher names it, has every rank print its Python stacks,
    and stops the job (status hung). A checkpoint save keeps the heartbeat moving and may take up to 12 times this
    limit. Watched from each rank's first finished step; 0 = no watchdog."""
    max_restarts: int = 0
    """After a failed attempt, start the job again this many times at most, from the run's newest complete
    checkpoint (each attempt's rank logs are kept in attempt.<k>/). Not after an interrupt or bad input."""


@dataclass
class DebugConfig:
    fail_rank: int = -1
    """Fault injection for testing supervision: this rank raises ... (in the first attempt only); -1 = off."""
    fail_step: int = -1
    """... once this step is done and logged."""


@dataclass
class HeteroConfig:
    """The root of every hetero-launch config."""

    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    model: Any = MISSING
    """Recipe-specific; typed by the recipe's model_config."""
    data: Any = MISSING
    """Recipe-specific; typed by one of the recipe's data_configs. A recipe in your folder: any map-style Dataset
    by _target_, items (input_1, ..., input_k, label)."""
    eval_data: Any = None
    """A recipe in your folder: a held-out Dataset like data, evaluated at the end (and every eval.every steps);
    null = no evaluation. Built-in recipes bring their own held-out data."""
    loss: Any = MISSING
    """The loss by _target_ with its constructor's arguments (``{_target_: launcher.losses.TokenCrossEntropy,
    shift: true}``), called as loss(output, label)."""
    model_output: str = "auto"
    """What of the model's output the loss and evaluation take: auto (a tensor as it is; a dict's or HuggingFace
    ModelOutput's ``logits``, else its first value; a tuple's first element), or a key/attribute path (``logits``,
    ``out.0``)."""
    data_inputs: list[str] = field(default_factory=list)
    """A recipe in your folder whose items are dicts: the keys passed to the model as keyword inputs, in order;
    [] = every key but the label."""
    data_label: str = ""
    """A recipe in your folder whose items are dicts: the label's key; "" = ``labels``, else ``label``."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    tables: dict[str, TableConfig] = field(default_factory=dict)
    """Per embedding table of the recipe: its optimizer. A table not listed uses TableConfig's defaults."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    precision: str = "fp32"
    """fp32, bf16 or fp16 (fp16 needs an accelerator)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    logger: Any = "tensorboard"
    """Where rank 0 sends the metrics as they are logged (training loss, throughput, lr, evaluation): a class by
    _target_ with its constructor's arguments (launcher/loggers: log_metrics(step, metrics) and close()), a list of
    them, or null / none = no logger. Default: TensorBoard event files in log_output/<run>/tensorboard/."""
    recompute: list[str] = field(default_factory=list)
    """Activation checkpointing (MindSpore's cell.recompute()): layers, by the names of the recipe's layers() (gpt:
    embedding, block.0, ...; your model: its top-level children), whose activations are recomputed in the backward
    instead of kept; [all] = every layer. A launcher key, not model.recompute: model keys are the model's arguments."""
    smoke: bool = False
    """A smoke run of the recipe: its smoke_profile (tiny shapes), 2 steps, 2 gloo ranks on the CPU, 2 held-out
    batches, a checkpoint written and read back; the recipe's structure (placement, parallel parts, ZeRO) is kept. Any
    override on the command line still applies on top."""
    smoke_profile: dict[str, Any] = field(default_factory=dict)
    """The recipe's tiny shapes for smoke=true, as nested keys (e.g. {model: {rows_per_table: 100}}). Every
    built-in recipe sets one; a recipe in your folder may."""
    smoke_changes: list[str] = field(default_factory=list)
    """Set by the launcher with smoke=true: each key the profile changed, 'key: before -> after' (shown in the plan)."""
    dry_run: bool = False
    """Plan, write the run dir and print; spawn nothing."""
    script: str = ""
    """Run this Python script on every rank instead of a recipe, with torchrun's environment."""
    script_args: list[str] = field(default_factory=list)
    """Arguments for the script (on the command line: everything after --)."""
    script_ops: list[str] = field(default_factory=list)
    """DeepSpeed JIT ops the script= loads itself (e.g. [fused_adam] for deepspeed.ops.adam.FusedAdam): the launcher
    builds them once per venv, before the ranks start, as it does the ops of the engine it plans; otherwise each
    rank compiles them on first use (minutes). Names as in launcher/plan/ds_ops.py BUILDERS; script= only."""


def register_schemas(names: Iterable[str] | None = None) -> None:
    """Store the root schema and the model/data schemas of the named recipes (default: all) in Hydra's ConfigStore.
    Idempotent. Storing converts each dataclass to a config node, so a run stores only its own recipe's."""
    from launcher.recipes import RECIPES

    _store_once(None, "hetero_launch_schema", HeteroConfig)
    for name in RECIPES if names is None else names:
        recipe = RECIPES[name]
        _store_once("schema/model", name, recipe.model_config)
        for option, node in recipe.data_configs.items():  # choices of the data group
            _store_once("schema/data", option, node)


_STORED: dict[tuple[str | None, str], type] = {}
"""(group, name) -> the dataclass this process stored there."""


def _store_once(group: str | None, name: str, node: type) -> None:
    """ConfigStore.store converts the dataclass to a config node (~10 ms for the root schema); a process that composes
    many configs (``check``, a sweep, the tests) stores each class once. Another class under the same name is stored."""
    if _STORED.get((group, name)) is not node:
        ConfigStore.instance().store(group=group, name=name, node=node)
        _STORED[(group, name)] = node
