"""mnist_mlp: the network of MindSpore's Host&Device sample (Flatten, three Dense layers with ReLUs, SGD lr 0.01,
cross-entropy, batch 32) on generated MNIST-shaped digits; ``'+placement.modules={dense*: host}'`` puts every Dense
layer on the host CPU while the rest stays on the device, as the sample does: the second Host&Device example beside
wide_deep's tables."""

from dataclasses import asdict, dataclass

from launcher.contract import DataFacts


@dataclass
class ModelConfig:
    _target_: str = "launcher.recipes.mnist_mlp.model.HostDeviceNet"
    in_features: int = 784
    """Input width: the image's pixels (28 × 28)."""
    hidden: int = 512
    """Width of the two hidden Dense layers."""
    classes: int = 10
    """Output width: the classes."""


@dataclass
class DataConfig:
    _target_: str = "launcher.recipes.mnist_mlp.data.GeneratedDigits"
    samples: int = 6000
    """Training images (generated once, every rank the same)."""
    eval_samples: int = 1000
    """Held-out images."""
    side: int = 28
    """Image side in pixels; side × side must equal model.in_features."""
    classes: int = 10
    """Classes; must equal model.classes."""
    noise: float = 0.5
    """Standard deviation of the Gaussian noise over each class's stroke pattern."""
    seed: int = 0
    """Seed of the images themselves (the data order follows trainer.seed)."""


class MnistMlp:
    name = "mnist_mlp"
    model_config = ModelConfig
    data_configs = {"digits": DataConfig}

    def data_facts(self, data: DataConfig) -> DataFacts:
        """Generated images every rank holds whole: float32 pixels and int64 labels."""
        per = data.side * data.side * 4 + 8
        return DataFacts(train_samples=data.samples, samples_key="data.samples", eval_samples=data.eval_samples,
                         resident_bytes=(data.samples + data.eval_samples) * per, binary_labels=False)

    def model_spec(self, model: ModelConfig, facts: DataFacts) -> dict:
        return asdict(model)

    def tables(self, model: dict) -> dict[str, tuple[int, int]]:
        return {}

    def module_params(self, model: dict) -> dict[str, int]:
        """Parameters of each module a placement may name (optional hook: placement.modules)."""
        i, h, c = model["in_features"], model["hidden"], model["classes"]
        return {"dense1": i * h + h, "dense2": h * h + h, "dense3": h * c + c}

    def module_io(self, model: dict) -> dict[str, tuple[int, int]]:
        """(input, output) floats per sample of each Dense layer (optional hook: what a host layer copies)."""
        i, h, c = model["in_features"], model["hidden"], model["classes"]
        return {"dense1": (i, h), "dense2": (h, h), "dense3": (h, c)}

    def dense_param_count(self, model: dict) -> int:
        return sum(self.module_params(model).values())

    def problems(self, model: dict, data: DataConfig, micro_group: int) -> list[str]:
        out = [f"model.{k}={model[k]} must be >= 1 (a layer of width 0 trains nothing)."
               for k in ("in_features", "hidden", "classes") if model[k] < 1]
        if data.side * data.side != model["in_features"]:
            out.append(f"data.side={data.side} makes {data.side * data.side} pixels and model.in_features="
                       f"{model['in_features']}. Set model.in_features={data.side * data.side}.")
        if data.classes != model["classes"]:
            out.append(f"data.classes={data.classes} differs from model.classes={model['classes']}. Set both alike.")
        if data.eval_samples < 1:
            out.append(f"data.eval_samples={data.eval_samples} must be >= 1 (the held-out images scored at the end).")
        if not data.noise >= 0:
            out.append(f"data.noise={data.noise} must be a number >= 0 (the noise's standard deviation), e.g. 0.5.")
        return out

    def layer_names(self, model: dict) -> list[str]:
        return ["flatten", "dense1", "relu1", "dense2", "relu2", "dense3"]

    def layers(self, model) -> list:
        return [(n, getattr(model, n)) for n in self.layer_names({})]


RECIPE = MnistMlp()
