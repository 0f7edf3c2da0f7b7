"""The schema's sections for how the model is split over the ranks and where its state lives: ``parallel``, ``zero``,
``deepspeed`` and ``placement`` (part of the typed config in launcher/schema.py, which nests them in HeteroConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    table. Needs a row-sparse table optimizer whose state splits with the rows (lazy_adam, ftrl, sgd, momentum,
    adagrad, rowwise_adagrad)."""
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
    modules: dict[str, str] = field(default_factory=dict)
    """Per module of the dense network, by its path in the model or a glob (dense1, towers.0.mlp, dense*): host = its
    parameters, gradients and optimizer states live in host memory and its forward and backward run on the host CPU
    (its inputs copied there, its outputs back), its gradients averaged over the data-parallel ranks on the host;
    device (the default) = where the parallel parts put it. Tables have placement.tables."""
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
