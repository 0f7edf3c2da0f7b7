"""resnet: a ResNet-50-shaped network (head, layer1-4 of bottleneck blocks, fc; MindSpore's pipeline example) with
its widths scaled down for a CPU, on synthetic images whose classes carry a learnable pattern. The default run
recomputes layer1-4 (activation checkpointing), as the seeds' example does."""

from dataclasses import asdict, dataclass, field

from launcher.contract import DataFacts


MAX_IMAGE_SIDE = 16_384
"""data.image_size beyond this is a typo: the plan does not count activations, so nothing else would stop it."""

@dataclass
class ModelConfig:
    _target_: str = "launcher.recipes.resnet.model.ResNet"
    classes: int = 10
    """Output classes; must equal data.classes."""
    width: int = 8
    """Channels of the stem; stage i's bottlenecks are width × 2^i wide inside and 4 × that outside."""
    blocks: list[int] = field(default_factory=lambda: [3, 4, 6, 3])
    """Bottleneck blocks of layer1-4 (ResNet-50: 3, 4, 6, 3)."""
    channels: int = 3
    """Image channels; must equal data.channels."""


@dataclass
class DataConfig:
    """data=images: synthetic class patterns plus noise."""

    _target_: str = "launcher.recipes.resnet.data.SyntheticImages"
    classes: int = 10
    """Classes (one smooth random pattern each)."""
    image_size: int = 32
    """Height and width of the images."""
    channels: int = 3
    """Image channels."""
    noise: float = 1.0
    """Standard deviation of the noise added to each pattern (the patterns have about 1)."""
    seed: int = 0
    """Seed of the patterns; the sample stream follows trainer.seed."""


class ResNetRecipe:
    name = "resnet"
    model_config = ModelConfig
    data_configs = {"images": DataConfig}

    def data_facts(self, data: DataConfig) -> DataFacts:
        return DataFacts(binary_labels=False)  # an endless stream of labelled images

    def model_spec(self, model: ModelConfig, facts: DataFacts) -> dict:
        return asdict(model)

    def tables(self, model: dict) -> dict[str, tuple[int, int]]:
        return {}

    def dense_param_count(self, model: dict) -> int:
        """Convolutions, batch norms and the classifier, counted as ResNet builds them."""
        w, c = model["width"], model["channels"]
        total, inputs = c * w * 9 + 2 * w, w
        for i, count in enumerate(model["blocks"]):
            mid = w * 2**i
            for b in range(count):
                cin = inputs if b == 0 else mid * 4
                total += cin * mid + 2 * mid + mid * mid * 9 + 2 * mid + mid * mid * 4 + 2 * mid * 4
                if b == 0 and (i > 0 or cin != mid * 4):
                    total += cin * mid * 4 + 2 * mid * 4
            inputs = mid * 4
        return total + inputs * model["classes"] + model["classes"]

    def problems(self, model: dict, data: DataConfig, micro_group: int) -> list[str]:
        out = [f"data.{k}={getattr(data, k)} differs from model.{k}={model[k]}. Set both to the same value."
               for k in ("classes", "channels") if model[k] != getattr(data, k)]
        out += [f"model.{k}={model[k]} must be >= {low}." for k, low in (("width", 1), ("channels", 1), ("classes", 2))
                if model[k] < low]
        if not 1 <= data.image_size <= MAX_IMAGE_SIDE:
            out.append(f"data.image_size={data.image_size} must be 1 to {MAX_IMAGE_SIDE:,} pixels per side (a bigger "
                       f"image is no input a network is fed whole), e.g. data.image_size=32.")
        if not data.noise >= 0:
            out.append(f"data.noise={data.noise} must be >= 0 (the noise's standard deviation).")
        if len(model["blocks"]) != 4 or min(model["blocks"]) < 1:
            out.append(f"model.blocks={model['blocks']} must give 4 stages of at least one block, e.g. [3, 4, 6, 3].")
        return out

    def layer_names(self, model: dict) -> list[str]:
        return ["head", "layer1", "layer2", "layer3", "layer4", "fc"]

    def layers(self, model) -> list:
        """head, layer1 ... layer4, fc: running them in order is the forward."""
        return model.named_layers()


RECIPE = ResNetRecipe()
