"""wide_deep: Wide&Deep CTR model (Cheng et al. 2016; MindSpore's model_zoo wide_and_deep) over synthetic
Criteo-shaped data: 13 continuous and 26 categorical fields, each field hashed into its own range of rows.

Two embedding tables, as in MindSpore: ``deep_embedding`` (rows x embed_dim) feeds the MLP, ``wide_embedding``
(rows x 1) is the wide linear part over the same ids. Both are one tensor with a row offset per field. MindSpore
trains them with LazyAdam (deep) and FTRL (wide) and, with host_device_mix, keeps them on the host."""

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    _target_: str = "launcher.recipes.wide_deep.model.WideDeep"
    num_dense: int = 13
    """Continuous fields."""
    num_sparse: int = 26
    """Categorical fields (one table range per field)."""
    rows_per_table: int = 10_000
    """Hashed vocabulary rows per categorical field."""
    embed_dim: int = 16
    """Width of the deep embeddings."""
    hidden: list[int] = field(default_factory=lambda: [256, 128])
    """MLP hidden widths."""


@dataclass
class DataConfig:
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


def tables(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """The embedding tables of WideDeep: name -> (rows, dim). Their placement and optimizers are planned per table."""
    rows = model.num_sparse * model.rows_per_table
    return {"deep_embedding": (rows, model.embed_dim), "wide_embedding": (rows, 1)}


def dense_param_count(model: ModelConfig) -> int:
    """Parameters of WideDeep outside the tables (the MLP and the wide part's dense linear), without building it."""
    widths = [model.num_dense + model.num_sparse * model.embed_dim, *model.hidden, 1]
    mlp = sum(a * b + b for a, b in zip(widths, widths[1:]))
    return mlp + model.num_dense + 1


def problems(model: ModelConfig, data: DataConfig, micro_group: int) -> list[str]:
    """Recipe-specific checks, reported with every other config problem before anything runs."""
    out = []
    for key in ("num_dense", "num_sparse", "rows_per_table"):
        if getattr(model, key) != getattr(data, key):
            out.append(
                f"data.{key}={getattr(data, key)} differs from model.{key}={getattr(model, key)}. "
                f"Set both to the same value (the recipe links them: override model.{key} only)."
            )
    if model.rows_per_table < 1 or model.embed_dim < 1:
        out.append(
            f"model.rows_per_table={model.rows_per_table} and model.embed_dim={model.embed_dim} must be >= 1."
        )
    return out
