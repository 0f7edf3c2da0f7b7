"""Typed schema of a hetero-launch config, registered in Hydra's ConfigStore.

One dataclass per section. A recipe YAML (``conf/recipe/<name>.yaml``) fills these sections in; the recipe's own
model and data schemas live beside its code in ``recipes/<name>/__init__.py`` and are registered here too, so every
key a user can type is typed and known before anything runs.

Sentinels: ``-1`` means "infer it" wherever a field says so; ``"auto"`` means "decide from the host".

The sections of how the model is split and where its state lives (parallel, zero, deepspeed, placement) are in
launcher/schema_parallel.py; those of where the ranks start and how they are watched (cluster, output, launcher,
debug) in launcher/schema_cluster.py. Both are importable from here as well."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from launcher.schema_cluster import ClusterConfig, DebugConfig, LauncherConfig, OutputConfig
from launcher.schema_parallel import DeepSpeedSection, ParallelConfig, PlacementConfig, ZeroConfig


@dataclass
class RecipeConfig:
    name: str = MISSING
    """Name of the recipe; also the run-id prefix."""


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
    ftrl (FTRL-Proximal), sgd, momentum, adagrad (torch's Adagrad on the rows of each step), rowwise_adagrad (one
    accumulator a row, as FBGEMM's and TorchRec's default), or dense (with the rest of the model, by the parallel
    parts, with optimizer.name)."""
    lr: float = 1e-3
    """Learning rate of the table's optimizer."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """lazy_adam's / sparse_adam's (beta1, beta2)."""
    eps: float = 1e-8
    """lazy_adam's, adagrad's and rowwise_adagrad's epsilon."""
    l1: float = 0.0
    """ftrl's L1 strength."""
    l2: float = 0.0
    """ftrl's L2 strength."""
    lr_power: float = -0.5
    """ftrl's learning-rate power (<= 0; -0.5 = 1/sqrt schedule)."""
    initial_accumulator: float = 0.1
    """ftrl's, adagrad's and rowwise_adagrad's starting squared-gradient accumulator (> 0; TensorFlow's Adagrad
    default)."""
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
class EarlyStopConfig:
    patience: int = 0
    """Stop every rank after this many validations in a row without improvement; 0 = never stop early. Needs a
    validation split (data.val_fraction); the best checkpoint is kept (checkpoints/best) and the test split is scored
    once, at the end, on it."""
    metric: str = "loss"
    """What is watched on the validation split: loss; auc, accuracy or logloss with eval.metrics=binary."""
    mode: str = "auto"
    """min or max: whether a lower or a higher metric is better; auto = max for auc and accuracy, min otherwise."""
    min_delta: float = 0.0
    """An improvement smaller than this (in the metric's unit) does not count as one."""


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
    job refuses one that holds checkpoints already, unless it resumes from one of them (trainer.resume_from)."""
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
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    """Early stopping on the validation split (as Keras' EarlyStopping and Lightning's callback)."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate every N steps as well as at the end; 0 = only at the end. With a validation split (data.val_fraction)
    it is the validation split that is scored every N steps (0 = once an epoch), the test split only at the end."""
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
    val_data: Any = None
    """A recipe in your folder: a validation Dataset (map-style, like data), scored every eval.every steps (0: once an
    epoch) and at the last step, and watched by trainer.early_stop; eval_data is then scored only at the end. null =
    none. data=tabular: data.val_fraction instead."""
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
