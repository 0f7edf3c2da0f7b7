"""quickstart: MindSpore's quick-start network (Dense 32->16, ReLU, Dense 16->16), MSE loss, Momentum optimizer,
on a fixed set of random inputs and labels. The smallest real job: it proves the launcher end to end in seconds."""

from dataclasses import dataclass


@dataclass
class ModelConfig:
    _target_: str = "launcher.recipes.quickstart.model.Network"
    in_features: int = 32
    """Input width."""
    hidden: int = 16
    """Hidden width."""
    out_features: int = 16
    """Output width."""


@dataclass
class DataConfig:
    _target_: str = "launcher.recipes.quickstart.data.FixedRandom"
    samples: int = 64
    """Size of the fixed random data set (inputs and labels drawn once from a normal distribution)."""
    in_features: int = 32
    """Input width; must equal model.in_features."""
    out_features: int = 16
    """Label width; must equal model.out_features."""
    seed: int = 0
    """Seed of the data set itself (the data order follows trainer.seed)."""


def samples_per_epoch(data: DataConfig) -> int | None:
    """Samples in one epoch of the fixed data set."""
    return data.samples


def tables(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """Embedding tables: none."""
    return {}


def dense_param_count(model: ModelConfig) -> int:
    """Parameters of Network for these sizes, without building it."""
    return model.in_features * model.hidden + model.hidden + model.hidden * model.out_features + model.out_features


def problems(model: ModelConfig, data: DataConfig, micro_group: int) -> list[str]:
    """Recipe-specific checks, reported with every other config problem before anything runs."""
    out = []
    for key in ("in_features", "out_features"):
        if getattr(model, key) != getattr(data, key):
            out.append(
                f"data.{key}={getattr(data, key)} differs from model.{key}={getattr(model, key)}. "
                f"Set both to the same value."
            )
    if data.samples < micro_group:
        out.append(
            f"data.samples={data.samples} is smaller than one global micro-batch (micro_size x dp = {micro_group}). "
            f"Set data.samples>={micro_group} or lower batch.micro_size."
        )
    return out
