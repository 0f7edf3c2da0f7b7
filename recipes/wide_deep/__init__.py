"""wide_deep: Wide&Deep CTR model (Cheng et al. 2016; MindSpore's model_zoo wide_and_deep) over synthetic
Criteo-shaped data: 13 continuous and 26 categorical fields, each field hashed into its own range of rows.

Two embedding tables, as in MindSpore: ``deep_embedding`` (rows x embed_dim) feeds the MLP, ``wide_embedding``
(rows x 1) is the wide linear part over the same ids. Both are one tensor with a row offset per field. MindSpore
trains them with LazyAdam (deep) and FTRL (wide) and, with host_device_mix, keeps them on the host."""

import math
from dataclasses import asdict, dataclass, field

from omegaconf import MISSING

from launcher.contract import DataFacts, Operator
from launcher.errors import ConfigError


@dataclass
class ModelConfig:
    _target_: str = "launcher.recipes.wide_deep.model.WideDeep"
    num_dense: int = 13
    """Continuous fields."""
    num_sparse: int = 26
    """Categorical fields (one table range per field)."""
    rows_per_table: int = 10_000
    """Hashed vocabulary rows per categorical field (when field_sizes is empty)."""
    field_sizes: list[int] = field(default_factory=list)
    """Rows of each categorical field; empty = rows_per_table each. data=tabular fills it from the file."""
    embed_dim: int = 16
    """Width of the deep embeddings."""
    hidden: list[int] = field(default_factory=lambda: [256, 128])
    """MLP hidden widths."""


@dataclass
class SyntheticDataConfig:
    """data=synthetic_ctr: Criteo-shaped samples from a known logistic model (so the Bayes AUC is known)."""

    _target_: str = "launcher.recipes.wide_deep.data.SyntheticCTR"
    num_dense: int = 13
    """Continuous fields; must equal model.num_dense."""
    num_sparse: int = 26
    """Categorical fields; must equal model.num_sparse."""
    rows_per_table: int = 10_000
    """Ids per field are drawn in [0, rows_per_table); must equal model.rows_per_table."""
    seed: int = 0
    """Seed of the generating model (field effects); the sample stream follows trainer.seed."""
    effect_scale: float = 1.0
    """Largest per-id effect on the logit (of the most frequent id)."""
    effect_decay: float = 0.3
    """Effect of id k is scaled by (1 + k)^-decay: frequent ids matter more, as in real CTR data."""
    interactions: list[list[int]] = field(default_factory=lambda: [[0, 1], [2, 3], [4, 5]])
    """Field pairs with a joint effect on the logit."""
    interaction_scale: float = 1.0
    """Largest pairwise effect."""


@dataclass
class TabularDataConfig:
    """data=tabular: a user's CSV / CSV.gz / Parquet file (see recipes/wide_deep/tabular.py), or a directory or glob of
    Parquet files streamed by row group (recipes/wide_deep/_tabular_stream.py)."""

    _target_: str = "launcher.recipes.wide_deep.tabular.TabularCTR"
    path: str = MISSING
    """The file; or a directory or glob of Parquet files (data larger than memory: each rank streams its own row
    groups; needs hash_buckets)."""
    label: str = MISSING
    """The label column."""
    positive: str = ""
    """The label value of a positive (clicked) row; empty = 1 / true / 1.0 of a 0/1 or true/false label column."""
    negative: str = ""
    """The label value of a negative row; empty = the one other value in the column."""
    categorical: list[str] = field(default_factory=list)
    """Columns to treat as categorical even if numeric."""
    continuous: list[str] = field(default_factory=list)
    """Columns to treat as continuous."""
    drop: list[str] = field(default_factory=list)
    """Columns to ignore (ids, leaks)."""
    test_fraction: float = 0.2
    """Share of rows held out for evaluation (seeded split); streamed: share of the row groups."""
    val_fraction: float = 0.0
    """Share of the file's rows held out for validation, taken from the train split (0.1 with test_fraction 0.2:
    70 % train, 10 % validation, 20 % test); scored during training (eval.every, trainer.early_stop). 0 = none. One
    file only (streamed data: not built)."""
    max_vocab: int = 100_000
    """A categorical column with more distinct values is hashed into this many buckets (vocabularies only: with
    hash_buckets a value other than this default is refused, as it would do nothing)."""
    crosses: list[list[str]] = field(default_factory=list)
    """Pairs of columns whose value pairs become extra categorical fields, e.g. [[education,occupation]]."""
    seed: int = 0
    """Seed of the train/test split."""
    hash_buckets: int = 0
    """Rows of every categorical field and cross when > 0: each value hashed from the file as it is read (row
    1 + blake2b-64(text) mod (hash_buckets - 1); row 0 = a missing value), no vocabulary; collisions are counted and
    shown in the plan. 0 = vocabularies from the train split (max_vocab). At least 2 (ids are int32)."""
    eval_path: str = ""
    """Streamed data only: a directory or glob of held-out Parquet files; empty = hold out test_fraction of
    data.path's row groups."""
    shuffle_rows: int = 0
    """Streamed data only: rows of a rank's shuffle window (rounded up to micro-batches); 0 = the biggest row
    group's rows. Memory grows with it."""
    prefetch: int = 1
    """Streamed data only: windows a background thread reads ahead of training; 0 = read on the training thread."""


class WideDeepRecipe:
    name = "wide_deep"
    model_config = ModelConfig
    data_configs = {"synthetic_ctr": SyntheticDataConfig, "tabular": TabularDataConfig}

    def data_facts(self, data) -> DataFacts:
        """Synthetic data: an endless stream. A tabular file: read once here, so that errors in it are reported
        like config errors and the model is sized from its columns and vocabularies."""
        if not isinstance(data, TabularDataConfig):
            return DataFacts()
        from launcher.recipes.wide_deep._tabular_columns import column_conflicts

        conflicts = column_conflicts(data.label, data.categorical, data.continuous, data.drop, data.crosses)
        if conflicts:
            raise ConfigError(conflicts)
        from launcher.recipes.wide_deep._tabular_read import is_streamed
        from launcher.recipes.wide_deep._tabular_val import val_problems, val_rows
        from launcher.recipes.wide_deep.tabular import TabularError, collision_lines, prepare

        if is_streamed(data.path):
            return _streamed_facts(data)
        stream_only = [k for k, default in STREAM_ONLY.items() if getattr(data, k) != default]
        if stream_only:
            raise ConfigError([f"data.{k}={getattr(data, k)} is for streamed data (data.path a directory or glob of "
                               f"Parquet files); data.path={data.path} is one file, read whole. Remove data.{k}."
                               for k in stream_only])
        try:
            p = prepare(data.path, data.label, str(data.positive), str(data.negative), list(data.categorical),
                        list(data.continuous), list(data.drop), data.test_fraction, data.max_vocab,
                        [list(c) for c in data.crosses], data.seed, data.hash_buckets, tensors=False)  # the facts only
        except TabularError as e:
            raise ConfigError(e.problems) from None
        problems = val_problems(data.path, p.train_rows, p.test_rows, data.val_fraction, data.test_fraction)
        if problems:
            raise ConfigError(problems)
        val = val_rows(p.train_rows, p.test_rows, data.val_fraction)
        rows = p.train_rows - val
        fields = (f"{p.categorical} hashed into {data.hash_buckets:,} rows each (row 0: a missing value)"
                  if data.hash_buckets and p.categorical else
                  f"{dict(zip(p.categorical, p.field_sizes)) or '-'} (rows incl. the out-of-vocabulary row)")
        line = (f"data: {data.path}: {rows:,} train + {f'{val:,} validation + ' if val else ''}{p.test_rows:,} test rows, {p.train_positive:.1%} "
                f"positive; continuous {p.continuous or '-'}; categorical {fields}{'; ' + p.note if p.note else ''}")
        sizes = {"num_dense": len(p.continuous), "num_sparse": len(p.categorical), "field_sizes": p.field_sizes}
        return DataFacts(train_samples=rows, val_samples=val, model_sizes=sizes, lines=(line, *collision_lines(p)),
                         resident_bytes=p.resident_bytes())

    def model_spec(self, model: ModelConfig, facts: DataFacts) -> dict:
        return {**asdict(model), **facts.model_sizes}

    def tables(self, model: dict) -> dict[str, tuple[int, int]]:
        """The embedding tables of WideDeep: name -> (rows, dim). Their placement and optimizers are planned per
        table."""
        rows = sum(model["field_sizes"]) if model["field_sizes"] else model["num_sparse"] * model["rows_per_table"]
        return {"deep_embedding": (rows, model["embed_dim"]), "wide_embedding": (rows, 1)}

    def lookups(self, model: dict) -> dict[str, float]:
        """Rows each sample looks up per table (optional hook: the memory model's figure when no trace ran): one
        per categorical field in both tables."""
        return {"deep_embedding": float(model["num_sparse"]), "wide_embedding": float(model["num_sparse"])}

    def dense_param_count(self, model: dict) -> int:
        """The MLP and the wide part's dense linear."""
        return sum(n for path, n in self.module_params(model).items() if "." not in path)

    def module_io(self, model: dict) -> dict[str, tuple[int, int]]:
        """(input, output) floats per sample of the modules module_params names."""
        widths = [model["num_dense"] + model["num_sparse"] * model["embed_dim"], *model["hidden"], 1]
        return {"wide_dense": (model["num_dense"], 1), "mlp": (widths[0], 1),
                **{f"mlp.{2 * k}": (a, b) for k, (a, b) in enumerate(zip(widths, widths[1:]))}}

    def module_params(self, model: dict) -> dict[str, int]:
        """Parameters of the modules placement.modules may name: wide_dense, mlp and each of mlp's Linear layers."""
        widths = [model["num_dense"] + model["num_sparse"] * model["embed_dim"], *model["hidden"], 1]
        linears = {f"mlp.{2 * k}": a * b + b for k, (a, b) in enumerate(zip(widths, widths[1:]))}
        return {"wide_dense": model["num_dense"] + 1, "mlp": sum(linears.values()), **linears}

    def problems(self, model: dict, data, micro_group: int) -> list[str]:
        out = []
        if model["field_sizes"] and len(model["field_sizes"]) != model["num_sparse"]:
            out.append(f"model.field_sizes has {len(model['field_sizes'])} entries for model.num_sparse="
                       f"{model['num_sparse']}. Give one size per categorical field, or leave it empty.")
        if model["rows_per_table"] < 1 or model["embed_dim"] < 1:
            out.append(f"model.rows_per_table={model['rows_per_table']} and model.embed_dim={model['embed_dim']} "
                       f"must be >= 1.")
        if isinstance(data, TabularDataConfig) and model["num_sparse"] < 1:  # (its sizes came from the file)
            out.append(f"data.path={data.path} gives no categorical column (every feature left after data.label and "
                       f"data.drop reads as a number), and the deep part embeds at least one. Name a column of ids or "
                       f"categories with data.categorical=[<column>] (a numeric one too), or a cross with "
                       f"data.crosses=[[<column>, <column>]].")
        elif model["num_dense"] < 0 or model["num_sparse"] < 1:
            out.append(f"model.num_dense={model['num_dense']} must be >= 0 and model.num_sparse={model['num_sparse']} "
                       f">= 1 (the deep part needs a categorical field).")
        if any(h < 1 for h in model["hidden"]) or any(f < 1 for f in model["field_sizes"]):
            out.append(f"model.hidden={list(model['hidden'])} and model.field_sizes={list(model['field_sizes'])} "
                       f"must hold widths >= 1 (a layer of width 0 trains nothing). E.g. model.hidden=[256,128].")
        if isinstance(data, SyntheticDataConfig):
            for key in ("effect_scale", "effect_decay", "interaction_scale"):  # 0 = no such signal planted
                value = getattr(data, key)
                if not (math.isfinite(value) and value >= 0):
                    out.append(f"data.{key}={value} must be a finite number >= 0. E.g. data.{key}=1.0.")
            for key in ("num_dense", "num_sparse", "rows_per_table"):
                if model[key] != getattr(data, key):
                    out.append(
                        f"data.{key}={getattr(data, key)} differs from model.{key}={model[key]}. Set both to the "
                        f"same value (the recipe links them: override model.{key} only)."
                    )
        return out

    def layer_names(self, model: dict) -> list[str]:
        return ["deep_embedding", "wide_embedding", "wide_dense", "mlp"]

    def layers(self, model) -> list:
        """The model's top-level modules: the two tables, the wide part's linear, the MLP."""
        return list(model.named_children())

    pipeline_split = "model"
    """A pipeline stage runs WideDeep's own forward, which skips the layers other stages hold (see model.py)."""

    def tp_plan(self, model: dict, tp: int) -> tuple[list[Operator], list[str]]:
        """parallel.tp: Megatron's MLP on the deep part: its Linear layers in pairs, the first column-split and the
        second row-split (one all-reduce per pair); an odd last Linear (the output) and the wide part stay
        replicated, as the tables do (the tp ranks see the same data)."""
        widths = [model["num_dense"] + model["num_sparse"] * model["embed_dim"], *model["hidden"], 1]
        ops, problems = [], []
        for k in range(0, len(widths) - 2, 2):  # Linear k (at mlp.{2k}) colwise, Linear k+1 rowwise
            w_in, mid, w_out = widths[k], widths[k + 1], widths[k + 2]
            if mid % tp:
                problems.append(f"parallel.tp={tp} splits the MLP's hidden width {mid} (model.hidden[{k}]) {tp} ways, "
                                f"and {tp} does not divide it. Set model.hidden[{k}] to a multiple of {tp}.")
            ops += [Operator(f"mlp.{2 * k}", "colwise", "matmul", w_in, mid, ("model.hidden", "model.hidden")),
                    Operator(f"mlp.{2 * k + 2}", "rowwise", "matmul", mid, w_out, ("model.hidden", "model.hidden"))]
        if not ops:
            problems.append(f"parallel.tp={tp}: model.hidden={list(model['hidden'])} leaves the MLP no pair of Linear "
                            f"layers to split. Give model.hidden at least one width.")
        return ops, problems


STREAM_ONLY = {"eval_path": "", "shuffle_rows": 0, "prefetch": 1}
"""data=tabular keys of streamed data only, with their defaults (another value with one file is refused)."""


def _streamed_facts(data: TabularDataConfig) -> DataFacts:
    """data.path a directory or glob: the facts from the Parquet footers (and one row group's label column)."""
    from launcher.recipes.wide_deep._tabular_files import stream_facts
    from launcher.recipes.wide_deep.tabular import TabularError

    if data.val_fraction:
        raise ConfigError([f"data.val_fraction={data.val_fraction}: a validation split of streamed data (data.path="
                           f"{data.path}, a directory or glob) is not built. Give one file, or set data.val_fraction=0 "
                           f"(data.eval_path holds out a test directory)."])
    try:
        lay, lines, held = stream_facts(data)
    except TabularError as e:
        raise ConfigError(e.problems) from None
    sizes = {"num_dense": len(lay.continuous), "num_sparse": len(lay.fields),
             "field_sizes": [data.hash_buckets] * len(lay.fields)}
    return DataFacts(train_samples=int(lay.train[:, 2].sum()), eval_samples=int(lay.eval[:, 2].sum()),
                     model_sizes=sizes, lines=tuple(lines), resident_bytes=held)


RECIPE = WideDeepRecipe()
