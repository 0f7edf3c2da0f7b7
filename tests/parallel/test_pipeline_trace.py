"""Pipeline stages cut by torch's tracer (launcher/parallel/pipeline_trace.py) from a model that is no chain of its
children: a torchvision-style ResNet (a flatten between avgpool and fc, residual blocks) split at a layer runs, stage
after stage, as the whole model; a forward torch.export cannot capture is refused before launch, with the reason."""

from __future__ import annotations

import copy

import torch
from torch import nn

from launcher.parallel.pipeline_trace import stage_io, trace
from launcher.plan.pipeline import PipelinePlan, StagePlan
from launcher.usercode.pipeline_check import check_pipeline, forward_order


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn(self.conv(x)))


class TinyResNet(nn.Module):
    """torchvision's ResNet layout: stem, layers, avgpool, flatten in forward, fc."""

    def __init__(self, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.layer1 = nn.Sequential(Block(width), Block(width))
        self.layer2 = nn.Sequential(Block(width))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.layer2(self.layer1(self.conv1(x))))
        return self.fc(torch.flatten(x, 1))


class Branchy(TinyResNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot capture it
            x = -x
        return super().forward(x)


def _plan(layers: tuple[str, ...], at: str) -> PipelinePlan:
    cut = layers.index(at)
    return PipelinePlan(stages=(StagePlan(0, layers[:cut], 0, 1), StagePlan(1, layers[cut:], 0, 1)), micro_batches=1,
                        partition="parallel.stages", split="trace")


def test_a_resnet_cut_at_a_layer_runs_stage_after_stage_as_the_whole_model():
    torch.manual_seed(0)
    model, x = TinyResNet(), torch.randn(2, 3, 8, 8)
    reference = copy.deepcopy(model)
    layers = tuple(forward_order(model, (x,)))
    assert layers == ("conv1", "layer1", "layer2", "avgpool", "fc")
    plan = _plan(layers, "layer2")
    pipe = trace(model, plan, (x,), "auto")
    first, second = pipe.get_stage_module(0), pipe.get_stage_module(1)
    assert {n.split(".")[0] for n, _ in first.named_parameters()} == {"conv1", "layer1"}
    assert {n.split(".")[0] for n, _ in second.named_parameters()} == {"layer2", "fc"}  # the model's own names
    sent = first(x)
    out = second(*sent) if isinstance(sent, tuple) else second(sent)
    want = reference(x)
    assert torch.equal(out, want)
    out.sum().backward()
    want.sum().backward()
    for name, p in second.named_parameters():
        assert torch.allclose(p.grad, reference.get_parameter(name).grad, rtol=1e-6, atol=1e-7), name
    for name, p in first.named_parameters():
        assert torch.allclose(p.grad, reference.get_parameter(name).grad, rtol=1e-6, atol=1e-7), name


def test_the_stages_shapes_come_from_the_model_on_meta():
    io, unused = stage_io({"_target_": f"{__name__}.TinyResNet"}, _plan(("conv1", "layer1", "layer2", "avgpool", "fc"),
                          "layer2"), (torch.randn(2, 3, 8, 8),), "auto", torch.float32)
    assert io[0][0][0].shape == (2, 3, 8, 8) and io[0][1][0].shape == (2, 4, 8, 8)
    assert io[1][1][0].shape == (2, 3) and unused == {0: set(), 1: set()}


def test_a_forward_torch_export_cannot_capture_is_refused_before_launch():
    with torch.device("meta"):
        model = Branchy()
    batch = ((torch.randn(2, 3, 8, 8),), torch.zeros(2, dtype=torch.long))
    problems, split, _ = check_pipeline({"_target_": f"{__name__}.Branchy"}, model, batch, "conf/recipe/x.yaml", 2,
                                        "auto")
    assert split == "trace" and len(problems) == 1
    assert problems[0].startswith("parallel.pipeline_stages=2: model (conf/recipe/x.yaml) is not a chain of its "
                                  "top-level children, and torch's pipeline tracer (torch.export) cannot capture")
    assert "set parallel.pipeline_stages=1" in problems[0]
