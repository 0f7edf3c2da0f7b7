"""Pipeline stages in bf16 and at the items of nn.Sequential stacks, without launching anything.

- A stage cut by torch's tracer runs in bf16 as FSDP2 hands it its parameters (bf16 parameters, fp32 buffers): the
  trace records the run's dtypes (an fp32 trace asserts fp32 where bf16 arrives, and its BatchNorm meets a bf16
  weight beside fp32 statistics), and every stage keeps the model's exact fp32 master weights.
- A Sequential of blocks (timm's ViT ``blocks``, torchvision's ResNet ``layer1``) is opened to its items as a
  ModuleList is; a Sequential of single operations stays one layer. Parameters on the model itself (a ViT's
  ``cls_token``, ``pos_embed``) count in the stage that holds them; ``parallel.stages`` takes ``blocks.2`` and
  ``blocks`` (its first item), ``recompute`` takes ``blocks`` (its items).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from launcher.facts.model import model_facts_on_meta
from launcher.parallel.pipeline_trace import trace, trace_as_run
from launcher.plan import plan_recompute
from launcher.plan.pipeline import PipelinePlan, StagePlan, plan_pipeline
from launcher.facts.pipeline_cut import check_pipeline, with_outside
from launcher.usercode.recipe import units
from launcher.parallel.precision import keep_batchnorm_fp32
from tests.parallel.test_pipeline_trace import TinyResNet

U = 2.0 ** -8
"""bf16's unit roundoff (8 significant bits)."""


def _plan(layers: tuple[str, ...], at: str) -> PipelinePlan:
    k = layers.index(at)
    return PipelinePlan(stages=(StagePlan(0, layers[:k], 0, 1), StagePlan(1, layers[k:], 0, 1)), micro_batches=1,
                        partition="parallel.stages", split="trace")


def _as_fsdp2_hands_them(stage: nn.Module) -> nn.Module:
    """A copy of ``stage`` with bf16 parameters and buffers as they are (FSDP2's MixedPrecisionPolicy)."""
    stage = copy.deepcopy(stage)
    for p in stage.parameters():
        p.data = p.data.to(torch.bfloat16)
    return stage


def _run(pipe, x: torch.Tensor) -> torch.Tensor:
    first, second = (_as_fsdp2_hands_them(pipe.get_stage_module(k)) for k in (0, 1))
    sent = first(x.to(torch.bfloat16))
    return second(*sent) if isinstance(sent, tuple) else second(sent)


def test_a_traced_resnet_with_batchnorm_runs_in_bf16_as_fsdp2_hands_it_its_parameters():
    torch.manual_seed(0)
    model, x = TinyResNet(), torch.randn(4, 3, 8, 8)
    layers = tuple(n for n, _ in units(model))
    assert layers == ("conv1", "layer1.0", "layer1.1", "layer2", "avgpool", "fc")  # layer1: a Sequential of blocks
    plan = _plan(layers, "layer1.1")
    masters = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="expected scalar type|dtype mismatch|same dtype"):
        _run(trace(copy.deepcopy(model), plan, (x,), "auto"), x)  # traced in fp32: what the ranks used to hit
    reference = copy.deepcopy(model)
    keep_batchnorm_fp32(model)  # what the rank does for bf16, before it traces
    pipe = trace_as_run(model, plan, (x.to(torch.bfloat16),), "auto", torch.bfloat16)  # the rank casts floats
    for k in (0, 1):
        for name, p in pipe.get_stage_module(k).named_parameters():
            assert p.dtype == torch.float32 and torch.equal(p, masters[name]), name  # the fp32 master weights
    out, want = _run(pipe, x), reference(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), want, rtol=0, atol=16 * U * want.abs().max().item()), (out, want)


class ViTBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))  # leaves: one layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyViT(nn.Module):
    """timm's ViT layout: patch_embed, cls_token and pos_embed on the model itself, blocks in an nn.Sequential."""

    def __init__(self, dim: int = 8, depth: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, 5, dim))
        self.blocks = nn.Sequential(*(ViTBlock(dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def _parallel(**stages: int) -> SimpleNamespace:
    return SimpleNamespace(pipeline_stages=2, stages=stages, partition="parameters", stages_per_rank=1)


def test_a_vit_splits_at_its_blocks_with_its_own_parameters_counted_where_they_are_used():
    with torch.device("meta"):
        model = TinyViT()
    batch = ((torch.randn(2, 3, 8, 8),), torch.zeros(2, dtype=torch.long))
    facts = model_facts_on_meta(model)
    assert facts.layers == ("patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head")
    problems, split, order, _ = check_pipeline({"_target_": f"{__name__}.TinyViT"}, model, batch, "x.yaml",
                                               _parallel(), "auto", facts)
    assert not problems and split == "graph"
    counts = with_outside(model, batch, order, facts.layer_params)
    total = sum(p.numel() for p in model.parameters())
    assert sum(counts.values()) == total != sum(facts.layer_params.values())
    assert counts["patch_embed"] == facts.layer_params["patch_embed"] + 8 + 5 * 8  # cls_token, pos_embed: stage 0
    plan, problems = plan_pipeline(2, 1, {}, "parameters", order, counts, facts.tied, split=split)
    assert not problems and plan.stages[1].layers[0].startswith("blocks.")  # balanced over the blocks
    assert sum(s.params for s in plan.stages) == total
    for named in ({"blocks.2": 1}, {"blocks": 1}):  # a stack's name is its first item
        plan, problems = plan_pipeline(2, 1, named, "parameters", order, counts, facts.tied, split=split)
        assert not problems, problems
        assert plan.stages[1].layers[0] == ("blocks.2" if "blocks.2" in named else "blocks.0")
    _, problems = plan_pipeline(2, 1, {"block.2": 1}, "parameters", order, counts, facts.tied)
    assert problems and "Did you mean blocks.2?" in problems[0]
    assert plan_recompute(["blocks", "head"], order) == (("blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"),
                                                         [], [])  # recompute=[blocks]: its items


def test_a_sequential_of_single_operations_or_below_the_top_level_stays_one_layer():
    model = nn.Module()
    model.mlp = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    model.stack = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2)))
    model.one = nn.Sequential(ViTBlock(2))
    model.deep = nn.Module()  # a Sequential of blocks below the top level stays inside its layer (TorchRec's MLP)
    model.deep.mlp = nn.Sequential(ViTBlock(2), ViTBlock(2))
    assert [n for n, _ in units(model)] == ["mlp", "stack.0", "stack.1", "one", "deep"]


def test_a_wrapper_of_one_model_has_that_models_layers():
    """A model whose one child is a model (TorchRec's DLRMTrain, a forward that builds a KeyedJaggedTensor and calls
    self.dlrm) is cut at that model's layers; a wrapper of a Sequential of single operations stays one layer."""
    inner = nn.Module()
    inner.dense = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    inner.stack = nn.ModuleList([ViTBlock(2), ViTBlock(2)])
    inner.head = nn.Linear(2, 1)
    wrapper = nn.Module()
    wrapper.dlrm = inner
    assert [n for n, _ in units(wrapper)] == ["dlrm.dense", "dlrm.stack.0", "dlrm.stack.1", "dlrm.head"]
    flat = nn.Module()
    flat.net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    assert [n for n, _ in units(flat)] == ["net"]
    twice = nn.Module()  # a wrapper of a wrapper (Outer.w = Wrapped(dlrm)): down to the model
    twice.outer = nn.Module()
    twice.outer.dlrm = inner
    assert [n for n, _ in units(twice)] == ["outer.dlrm.dense", "outer.dlrm.stack.0", "outer.dlrm.stack.1",
                                            "outer.dlrm.head"]
    plain = nn.Module()  # a model of single operations, not a Sequential: its layers, as unwrapped
    plain.fc1, plain.act, plain.fc2 = nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1)
    wrapped = nn.Module()
    wrapped.inner = plain
    assert [n for n, _ in units(wrapped)] == ["inner.fc1", "inner.act", "inner.fc2"] == [
        f"inner.{n}" for n, _ in units(plain)]
    deep_flat = nn.Module()  # wrappers of a Sequential of single operations: one layer, however deep
    deep_flat.outer = nn.Module()
    deep_flat.outer.net = flat.net
    assert [n for n, _ in units(deep_flat)] == ["outer"]


def test_real_timm_and_torchvision_models_open_their_stacks():
    try:  # torchvision's CUDA wheel beside a CPU torch raises RuntimeError on import, not ImportError
        import timm
        import torchvision
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"timm and torchvision do not import next to this torch (run.sh installs them best-effort): {e}")
    with torch.device("meta"):
        vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=4)
        resnet = torchvision.models.resnet18()
    assert [n for n, _ in units(vit)][4:8] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert [n for n, _ in units(resnet)][4:6] == ["layer1.0", "layer1.1"]
