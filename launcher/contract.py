"""The recipe contract, as code (torchtitan's TrainSpec, torchtune's recipe interface).

A recipe is an object with the attributes and hooks of ``Recipe`` below; ``check_recipe`` checks one when it is
registered (``recipes/__init__.py``), so a missing hook or a misspelt argument fails at import with its name, not
halfway through a run. Recipes implement the contract; they do not inherit from a base class or from each other.

The hooks the planner calls are torch-free and take the typed config objects of the recipe's own schemas
(``model_config``, ``data_configs``). Torch-side, the model is a plain ``nn.Module`` and
the data source follows ``DataSource``."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Batch = tuple[tuple[Any, ...], Any]
"""One micro-batch: (model inputs, labels)."""


@dataclass(frozen=True)
class DataFacts:
    """What the launcher learned about a recipe's data before planning, as HostFacts is for the host.

    Gathered by ``Recipe.data_facts`` (which may read the user's files) and handed to ``plan_launch``; the composed
    config is never changed."""

    train_samples: int | None = None
    """Training samples in one epoch; None for an endless stream (trainer.epochs is then refused)."""
    samples_key: str = ""
    """The config key that sets train_samples, when one does (a generated data set's data.samples): a problem with
    their number names it and its fix; "" = the data decides it (a file, a user's Dataset)."""
    model_sizes: dict[str, Any] = field(default_factory=dict)
    """Model keys the data decides (e.g. field_sizes of a tabular file); ``Recipe.model_spec`` applies them."""
    reference: dict[str, float] = field(default_factory=dict)
    """Numbers a trained model is measured against, e.g. {entropy_floor, uniform_loss} (nats per token)."""
    lines: tuple[str, ...] = ()
    """What to tell the user about the data before the plan."""
    binary_labels: bool | None = None
    """The labels are 0/1 floats with one score of the model each: eval.metrics=auto becomes binary (AUC, accuracy);
    False: they are not (eval.metrics=binary is refused); None: not known."""
    eval_samples: int | None = None
    """Held-out samples; None = the data source decides (endless data: eval.batches), 0 = none (no evaluation)."""
    val_samples: int = 0
    """Validation samples, a split apart from the train and test ones (the data source's ``val_batches``); 0 = none."""
    resident_bytes: int = 0
    """Bytes of the data set each rank holds in memory for the whole run (its arrays' own bytes, e.g. a tabular
    file's encoded splits); 0 = none or unknown: a stream generated batch by batch, or a user's Dataset (not sized)."""
    item_seconds: float = 0.0
    """Seconds a user's Dataset takes to give one item (the median of a few, timed before the plan; 0 = not timed):
    what ``loader.num_workers=auto`` decides by (launcher/plan/loader.py)."""
    item_cpu_share: float = 1.0
    """The share of that time spent on a CPU (the rest waits on files or the network)."""
    stream_items: int | None = None
    """A stream (train_samples None) that ended within the launcher's read of its first items: how many it gave;
    None = no stream, or one that did not end there."""


@dataclass(frozen=True)
class ModelFacts:
    """What the launcher learned about the model before planning: torch-free sizes from a built-in recipe's hooks,
    or, for a recipe in the user's folder, from the model itself built on the ``meta`` device (no memory)."""

    tables: dict[str, tuple[int, int]]
    """Embedding tables by module path (``user_emb``, ``towers.0.item_emb``) -> (rows, dim)."""
    dense_params: int
    """Parameters outside the tables."""
    layers: tuple[str, ...] = ()
    """Names of the model's top-level children (what pipeline stages and recompute refer to)."""
    layer_params: dict[str, int] | None = None
    """Parameters of each layer (a shared weight counts in every layer using it); None when not gathered (only
    runs with pipeline stages need them: ``launcher.facts.layer_sizes``)."""
    tied: tuple[tuple[tuple[str, ...], int], ...] = ()
    """Weights layers share: (``<layer>.<attribute path>`` of each use, elements) for each."""
    layer_paths: dict[str, str] | None = None
    """Each layer's module path in the model (gpt's block.0 is blocks.0): which pipeline stage holds a table or a
    tensor-parallel operator; None when not gathered (with layer_params)."""
    lines: tuple[str, ...] = ()
    """What to tell the user about the model before the plan."""
    kept: tuple[tuple[str, str], ...] = ()
    """Embeddings that always train inside the parts: (module path, why: a tied weight, max_norm, ...)."""
    aliases: tuple[tuple[str, str], ...] = ()
    """Other names of tables, (name, module path): a TorchRec collection's table name (``t_user`` for
    ``sparse_arch.embedding_bag_collection.embedding_bags.t_user``), which placement.tables and tables may use."""
    split: str = ""
    """How a pipeline cuts a user's model (launcher/plan/pipeline.py SPLITS: chain, graph or trace); '' = the recipe's
    own ``pipeline_split``."""
    uncuttable: tuple[tuple[str, str], ...] = ()
    """Layers no pipeline stage may begin at, with why: (layer, a value that is no tensor would cross there) each."""
    modules: dict[str, int] | None = None
    """Parameters of each module placement.modules may name, by module path (``dense1``, ``towers.0.mlp``; tables and
    modules holding one left out); None = not known (a built-in recipe without a ``module_params`` hook)."""
    module_io: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(input, output) floats per sample of a module on the host (what crosses each way); a module not here: not
    known. A built-in recipe's ``module_io`` hook, or a user's module's first and last nn.Linear."""
    single_item: str = ""
    """Why a micro-batch of one item fails the model or its loss (BatchNorm training on one value per channel, a
    squeeze() that drops the batch dimension), found on the first item alone; '' = it does not, or not checked."""
    sparse_grads: tuple[str, ...] = ()
    """Embeddings built with sparse=True (module paths): inside the parts, their gradients are sparse tensors, which
    only some optimizers take (DenseOptimizer.sparse_grads)."""
    state: dict[str, tuple[int, ...]] | None = None
    """The model's state dict on the meta device, name -> shape (a tied weight under its first name only), which a
    checkpoint to resume from must hold; None when not gathered (a built-in recipe: its config says its shapes)."""
    unused: tuple[str, ...] = ()
    """Trainable parameters (by name) that got no gradient from the loss of the data's first items on the meta device
    (a layer built and never called): torch DDP would stop at its second step (launcher/parallel/ddp.py)."""


@dataclass(frozen=True)
class Operator:
    """One operator of a recipe's forward, torch-free, for op-level sharding (``parallel.sharding``) and tensor
    parallel (``parallel.tp``). A recipe may bring two optional hooks: ``operators(model)``, its forward as a chain of
    these (kind matmul or elementwise; quickstart), and ``tp_plan(model, tp)`` -> (operators whose kind is a tensor-
    parallel style: colwise or rowwise; problems), what ``parallel.tp`` alone does (gpt)."""

    name: str
    """Module path in the model (``fc1``, ``blocks.0.attn.qkv``)."""
    kind: str
    """matmul | elementwise (operators), or colwise | rowwise (tp_plan)."""
    primitive: str
    """MindSpore's name of its kind (matmul, relu): the k-th such operator is also called <primitive>_<k-1>."""
    width_in: int
    width_out: int
    keys: tuple[str, str] = ("", "")
    """The config keys that set width_in and width_out (named in a refusal's fix)."""
    tokens: int = 0
    """Tokens per sample of its activations (gpt: the sequence length it sees); 0 = (batch, width) activations."""


@runtime_checkable
class Recipe(Protocol):
    name: str
    """The recipe's name (conf/recipe/<name>.yaml, the run-id prefix)."""
    model_config: type
    """Dataclass schema of the ``model`` section (with the model's ``_target_``)."""
    data_configs: Mapping[str, type]
    """Dataclass schemas of the ``data`` section, by option name (stored as schema/data/<option>)."""

    def data_facts(self, data: Any) -> DataFacts:
        """Facts of this data config (may read files; raise launcher.errors.ConfigError for bad input)."""

    def model_spec(self, model: Any, facts: DataFacts) -> dict[str, Any]:
        """The resolved model config, facts applied: the kwargs (with ``_target_``) every rank builds."""

    def tables(self, model: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        """Embedding tables of the model spec by module path (the ``nn.Embedding``'s attribute path in the model):
        path -> (rows, dim). Empty when the model has none."""

    def dense_param_count(self, model: Mapping[str, Any]) -> int:
        """Parameters outside the tables, from the model spec, without building the model."""

    def problems(self, model: Mapping[str, Any], data: Any, micro_group: int) -> list[str]:
        """Recipe-specific config problems (one sentence each: key, value, fix); micro_group = micro_size × dp."""

    def layer_names(self, model: Mapping[str, Any]) -> list[str]:
        """The names layers() gives for the model spec, without building the model (the plan checks recompute and
        stage names against them)."""

    def layers(self, model: Any) -> list[tuple[str, Any]]:
        """The built model's ordered, named top-level blocks (embedding, block.0, ..., head): what pipeline stages
        and recompute refer to. For a sequential model (gpt, quickstart) running them in order is the forward.

        Optional: ``pipeline_split = "model"`` says the model's own forward runs a pipeline stage by skipping the
        layers set to None (wide_deep's; torchtitan's manual split); by default ("chain") a stage runs its layers one
        after the other."""


class BackendRules(Protocol):
    """What a launch backend (one module of launcher/backends/, ``cluster.launch``) tells the plan: the plan gets the
    registry's backends in Facts.backends and asks them this, so it imports no backend (nothing above it)."""

    name: str
    help: str
    """What it is, for the list of choices in messages: 'local (one host)'."""
    launcher_per_host: bool
    """One launcher runs on every host and they meet at a rendezvous, which gives each its node rank."""
    restarts: bool
    """launcher.max_restarts > 0 restarts the job in place."""
    rdzv_backends: Mapping[str, Any]
    """The rendezvous backends its launchers may meet at (cluster.rdzv_backend), each name -> what it needs:
    ``store_in_launcher`` (the endpoint's host holds the store) and ``etcd``; none without a rendezvous."""
    scripts: bool
    """script= runs can start on it."""
    reads: tuple[str, ...]
    """The cluster.* keys only this backend reads: with another backend they are refused."""

    def problems(self, c: Any) -> list[str]:
        """Problems of the cluster.* keys (``c``: the cluster section) that only this backend has; pure."""


def backend_named(backends: tuple[BackendRules, ...], name: str) -> BackendRules | None:
    """The backend called ``name`` among ``backends``; None for another name (the plan's rules report it)."""
    return next((b for b in backends if b.name == str(name)), None)


@dataclass(frozen=True)
class PartRules:
    """What the plan asks of the parallel parts (``launcher.parallel.RULES``), handed to it in Facts.parts as the
    backends' rules are in Facts.backends, and as TorchRec's planner takes its sharders: the plan imports no part."""

    plan_parts: Callable[..., Any]
    """Intents -> (the parts in the order a rank applies them, problems, notes)."""
    run_facts: Callable[..., Any]
    """(Intents, parts) -> what the data-parallel part says of the run (ZeRO stage, dp_shard, ops, locations)."""
    rank_memory: Callable[..., Any]
    """(Intents, parts, placement, model memory, table terms=None) -> (memory, pipeline memory, peak)."""
    model_memory: Callable[..., Any]
    """(model facts, Facts, ranks per host) -> the model's bytes as the parts' memory rules read them."""
    config_file: Callable[..., Any]
    """parts -> the engine config file one of them writes (DeepSpeed's), or None."""
    adopt_config: Callable[..., Any]
    """cfg -> (cfg, notes, problems): a deepspeed.config file's intents where the config's own are not set."""


@dataclass(frozen=True)
class Facts:
    """Everything gathered before planning besides the host (launcher/facts/preflight.py): the plan's input."""

    backends: tuple[BackendRules, ...] = ()
    """The launch backends cluster.launch may name (launcher.backends.BACKENDS' values): what each can run."""
    parts: PartRules | None = None
    """The parallel parts' rules (launcher.parallel.RULES): how intents become parts and what those cost."""
    recipe: Any = None
    """The recipe cfg.recipe.name names (a built-in one, or a UserRecipe from your folder: a ``Recipe``)."""

    data: DataFacts = field(default_factory=DataFacts)
    model: ModelFacts | None = None
    """None: from the built-in recipe's torch-free hooks, in the plan."""
    code_paths: tuple[str, ...] = ()
    """Folders that hold the user's code (their recipe's _target_s): importable in the launcher and every rank."""
    activations: dict[str, dict[str, float]] | None = None
    """Per layer of layers(): bytes kept for the backward ("saved") and input bytes ("inputs"), per sample,
    estimated on the meta device (launcher/facts/activations.py); None when the plan needs none
    (launcher.facts.preflight.wants_activations)."""
    families: tuple[str, ...] = ()
    """Operator kinds with a runtime cost of their own (launcher/facts/activations.py Trace.families: conv)."""
    lookups: dict[str, float] | None = None
    """Rows each sample looks up per embedding table (module path -> rows), from the same trace; None = not traced
    (the memory model takes 1 per table)."""
    imports: tuple[int, str] = (0, "")
    """A recipe in your folder: (bytes importing its model's, data's, loss's and collate's packages added to the
    launcher's resident memory, what they were), measured in preflight; every rank imports them too (TorchRec and
    FBGEMM: ~110 MiB)."""


def model_facts(recipe: Recipe, model: Mapping[str, Any]) -> ModelFacts:
    """A built-in recipe's model facts, from its torch-free hooks."""
    hook = getattr(recipe, "module_params", None)  # optional: the modules placement.modules may name
    io = getattr(recipe, "module_io", None)  # optional: what crosses to and from each of them, per sample
    return ModelFacts(tables=recipe.tables(model), dense_params=recipe.dense_param_count(model),
                      layers=tuple(recipe.layer_names(model)), modules=hook(model) if hook else None,
                      module_io=io(model) if io else {})


def dp_share(batch: Batch, dp_rank: int, micro_size: int) -> Batch:
    """Data-parallel rank ``dp_rank``'s rows of a global micro-batch: rows [dp_rank × micro_size, + micro_size) of
    every input and of the labels (what makes the stream independent of how it is split over ranks)."""
    inputs, labels = batch
    part = slice(dp_rank * micro_size, (dp_rank + 1) * micro_size)
    return tuple(t[part] for t in inputs), labels[part]


def endless_shares(global_micro_batch: Callable[[int, int], Batch], dp_rank: int, dp_size: int, micro_size: int,
                   start: int = 0) -> Iterator[Batch]:
    """Rank ``dp_rank``'s shares of global micro-batches start, start+1, ... of an endless stream, where
    ``global_micro_batch(index, rows)`` draws global micro-batch ``index`` (seeded by it: the same samples however
    the batch is split over ranks)."""
    for index in itertools.count(start):
        yield dp_share(global_micro_batch(index, micro_size * dp_size), dp_rank, micro_size)


class DataSource(Protocol):
    """What the worker asks of the object built from ``data``'s ``_target_``."""

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[Batch]:
        """Endless micro-batches of data-parallel rank ``dp_rank``, from global micro-batch ``start`` on. Global
        micro-batch k is the same micro_size × dp_size samples however it is split over ranks."""

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        """Held-out micro-batches (``count`` global ones for endless data; a finite test split may ignore it)."""

    # Optional: val_batches(dp_rank, dp_size, micro_size, count), the validation split as eval_batches gives the test
    # split, for a data source whose facts say val_samples > 0 (scored during training, trainer.early_stop).


_HOOKS = ("data_facts", "model_spec", "tables", "dense_param_count", "problems", "layer_names", "layers")
_ATTRS = ("name", "model_config", "data_configs")


def check_recipe(recipe: object) -> None:
    """Raise TypeError naming every attribute or hook of the contract that ``recipe`` lacks or spells differently."""
    problems = [f"no attribute {a}" for a in _ATTRS if not hasattr(recipe, a)]
    for hook in _HOOKS:
        fn = getattr(recipe, hook, None)
        if not callable(fn):
            problems.append(f"no hook {hook}()")
            continue
        want = [p for p in inspect.signature(getattr(Recipe, hook)).parameters if p != "self"]
        got = list(inspect.signature(fn).parameters)
        if got != want:
            problems.append(f"{hook}({', '.join(got)}) should take ({', '.join(want)})")
    if problems:
        name = getattr(recipe, "name", type(recipe).__name__)
        raise TypeError(f"recipe {name} does not follow launcher.contract.Recipe: {'; '.join(problems)}")


def register(*recipes: object) -> dict[str, Recipe]:
    """name -> recipe, each checked against the contract; data option names must be unique across recipes."""
    out: dict[str, Recipe] = {}
    options: dict[str, str] = {}
    for r in recipes:
        check_recipe(r)
        if r.name in out:
            raise TypeError(f"two recipes are named {r.name}")
        for option in r.data_configs:
            if option in options:
                raise TypeError(f"data option {option} of recipe {r.name} is also recipe {options[option]}'s")
            options[option] = r.name
        out[r.name] = r
    return out
