"""quickstart: MindSpore's quick-start network (Dense 32->16, ReLU, Dense 16->16), MSE loss, Momentum optimizer,
on a fixed set of random inputs and labels. The smallest real job: it proves the launcher end to end in seconds."""

from dataclasses import asdict, dataclass

from launcher.contract import DataFacts, Operator


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


class Quickstart:
    name = "quickstart"
    model_config = ModelConfig
    data_configs = {"quickstart": DataConfig}

    def data_facts(self, data: DataConfig) -> DataFacts:
        """A fixed data set every rank holds whole: float32 inputs and labels, a train and a held-out copy."""
        resident = 2 * data.samples * (data.in_features + data.out_features) * 4
        return DataFacts(train_samples=data.samples, samples_key="data.samples", resident_bytes=resident,
                         binary_labels=False)

    def model_spec(self, model: ModelConfig, facts: DataFacts) -> dict:
        return asdict(model)

    def tables(self, model: dict) -> dict[str, tuple[int, int]]:
        return {}

    def dense_param_count(self, model: dict) -> int:
        i, h, o = model["in_features"], model["hidden"], model["out_features"]
        return i * h + h + h * o + o

    def problems(self, model: dict, data: DataConfig, micro_group: int) -> list[str]:
        out = [f"model.{k}={model[k]} must be >= 1 (a layer of width 0 trains nothing)."
               for k in ("in_features", "hidden", "out_features") if model[k] < 1]
        for key in ("in_features", "out_features"):
            if model[key] != getattr(data, key):
                out.append(
                    f"data.{key}={getattr(data, key)} differs from model.{key}={model[key]}. Set both to the same value."
                )
        return out

    def layer_names(self, model: dict) -> list[str]:
        return ["fc1", "relu", "fc2"]

    def layers(self, model) -> list:
        return [("fc1", model.fc1), ("relu", model.relu), ("fc2", model.fc2)]

    def operators(self, model: dict) -> list[Operator]:
        """The forward as a chain for parallel.sharding: fc1 (matmul), relu, fc2 (matmul_1)."""
        i, h, o = model["in_features"], model["hidden"], model["out_features"]
        return [Operator("fc1", "matmul", "matmul", i, h, ("model.in_features", "model.hidden")),
                Operator("relu", "elementwise", "relu", h, h, ("model.hidden", "model.hidden")),
                Operator("fc2", "matmul", "matmul", h, o, ("model.hidden", "model.out_features"))]

    def tp_plan(self, model: dict, tp: int) -> tuple[list[Operator], list[str]]:
        """parallel.tp alone: Megatron's MLP, fc1 column-split, fc2 row-split (one all-reduce per forward)."""
        fc1, _, fc2 = self.operators(model)
        return [Operator(**{**fc1.__dict__, "kind": "colwise"}), Operator(**{**fc2.__dict__, "kind": "rowwise"})], []


RECIPE = Quickstart()
