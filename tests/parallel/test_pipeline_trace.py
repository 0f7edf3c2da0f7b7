"""Pipeline stages of a model that is no chain of its children.

Cut by torch's tracer (launcher/parallel/pipeline_trace.py): a torchvision-style ResNet (a flatten between avgpool and
fc, residual blocks) split at a layer runs, stage after stage, as the whole model; a forward neither torch.fx nor
torch.export can record is refused before launch, with the reason.

Cut from the forward's graph (launcher/parallel/pipeline_graph.py): a recommendation model with seven inputs and a
skip connection past two stages runs, stage after stage, as the whole model (outputs and gradients), each stage taking
what crosses the boundary before it; keyword inputs from dict batches; a non-tensor input (a bag of ids read by value,
as a KeyedJaggedTensor is) consumed on stage 0, shaped on the CPU with its table never made; a cut that would send it
to stage 1 is refused before launch, naming the input and a cut that works."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from launcher.facts.model import model_facts_on_meta
from launcher.parallel.pipeline_graph import (cut_model, fed_positions, stage_io as graph_io, stage_module,
                                              trace_forward, unit_order)
from launcher.parallel.pipeline_trace import stage_io, trace
from launcher.plan.pipeline import PipelinePlan, StagePlan, plan_pipeline
from launcher.facts.pipeline_cut import check_pipeline, forward_order


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


def _plan(layers: tuple[str, ...], *at: str, split: str = "trace") -> PipelinePlan:
    cuts = [0, *(layers.index(a) for a in at), len(layers)]
    return PipelinePlan(stages=tuple(StagePlan(k, layers[a:b], 0, 1) for k, (a, b) in enumerate(zip(cuts, cuts[1:]))),
                        micro_batches=1, partition="parallel.stages", split=split)


def test_a_resnet_cut_at_a_layer_runs_stage_after_stage_as_the_whole_model():
    torch.manual_seed(0)
    model, x = TinyResNet(), torch.randn(2, 3, 8, 8)
    reference = copy.deepcopy(model)
    layers = tuple(forward_order(model, (x,)))
    assert layers == ("conv1", "layer1.0", "layer1.1", "layer2", "avgpool", "fc")  # layer1: a Sequential of blocks
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


def _parallel(stages: int = 2, **named: int) -> SimpleNamespace:
    return SimpleNamespace(pipeline_stages=stages, stages=named, partition="parameters", stages_per_rank=1)


def test_a_forward_neither_fx_nor_torch_export_can_record_is_refused_before_launch():
    with torch.device("meta"):
        model = Branchy()
    batch = ((torch.randn(2, 3, 8, 8),), torch.zeros(2, dtype=torch.long))
    problems, split, _, _ = check_pipeline({"_target_": f"{__name__}.Branchy"}, model, batch, "conf/recipe/x.yaml",
                                           _parallel(), "auto", model_facts_on_meta(model))
    assert split == "trace" and len(problems) == 1
    assert problems[0].startswith("parallel.pipeline_stages=2: model (conf/recipe/x.yaml) is not a chain of its "
                                  "top-level children, torch.fx cannot record its forward with its layers as leaves "
                                  "(symbolically traced variables cannot be used as inputs to control flow)")
    assert "torch's pipeline tracer (torch.export) cannot capture" in problems[0]
    assert "set parallel.pipeline_stages=1" in problems[0]


class Seven(nn.Module):
    """Seven positional inputs: user, item, a bag of history ids and their weights, a category, dense features and a
    scale that only the last layer's input uses (a skip connection past the stages between)."""

    def __init__(self) -> None:
        super().__init__()
        self.user_emb = nn.Embedding(50, 4)
        self.item_emb = nn.Embedding(30, 4)
        self.hist = nn.EmbeddingBag(30, 4, mode="sum")
        self.cat_emb = nn.Embedding(5, 4)
        self.dense_net = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(20, 6), nn.ReLU())
        self.out = nn.Linear(6 + 3, 1)

    def forward(self, user, item, hist, hist_weights, category, dense, scale):
        h = self.hist(hist, per_sample_weights=hist_weights)
        x = torch.cat([self.user_emb(user), self.item_emb(item), h, self.cat_emb(category), self.dense_net(dense)], 1)
        return self.out(torch.cat([self.top(x), dense * scale], dim=1)).squeeze(-1)


def seven_inputs(n: int = 4) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 50, (n,), generator=g), torch.randint(0, 30, (n,), generator=g),
            torch.randint(0, 30, (n, 5), generator=g), torch.rand(n, 5, generator=g),
            torch.randint(0, 5, (n,), generator=g), torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g))


def test_seven_inputs_and_a_skip_connection_cut_into_three_stages_run_as_the_whole_model():
    torch.manual_seed(0)
    model, inputs = Seven(), seven_inputs()
    reference = copy.deepcopy(model)
    names = [n for n, _ in model.named_children()]
    layers = tuple(unit_order(trace_forward(model, inputs, names), names))
    assert layers == ("hist", "user_emb", "item_emb", "cat_emb", "dense_net", "top", "out")  # the forward's order
    plan = _plan(layers, "item_emb", "top", split="graph")
    cut = cut_model(model, plan, inputs)
    # stage 0 sends its layers' outputs; the inputs are never sent: each later stage reads those it uses from the
    # micro-batch (dense * scale, made from inputs alone, is computed on stage 2, the one that uses it)
    assert cut.live == [["hist_1", "user_emb"], ["cat"]]
    assert cut.fed == [[], ["item", "category", "dense"], ["dense", "scale"]]
    assert [fed_positions(cut, k, inputs) for k in range(3)] == [(), (1, 4, 5), (5, 6)]
    stages = [stage_module(model, cut, s.index, s.layers, "auto") for s in plan.stages]
    assert [sorted({n.split(".")[0] for n, _ in m.named_parameters()}) for m in stages] == [
        ["hist", "user_emb"], ["cat_emb", "dense_net", "item_emb"], ["out", "top"]]  # the model's own names
    sent = stages[0](*inputs)
    sent = stages[1](*sent, inputs[1], inputs[4], inputs[5])
    out = stages[2](*sent, inputs[5], inputs[6])
    want = reference(*inputs)
    assert torch.equal(out, want)
    out.sum().backward()
    want.sum().backward()
    for m in stages:
        for name, p in m.named_parameters():
            assert torch.allclose(p.grad, reference.get_parameter(name).grad, rtol=1e-6, atol=1e-7), name
    io = graph_io({"_target_": f"{__name__}.Seven"}, plan, inputs, "auto", torch.bfloat16)  # shaped on meta
    assert [(tuple(t.shape), t.dtype, t.requires_grad) for t in io[1][0]] == [
        ((4, 4), torch.bfloat16, True), ((4, 4), torch.bfloat16, True)]
    assert [(tuple(t.shape), t.requires_grad) for t in io[2][0]] == [((4, 20), True)]
    assert [tuple(t.shape) for t in io[2][1]] == [(4,)]


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user_emb = nn.Embedding(10, 4)
        self.item_emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, user, item, scale=None):
        x = self.user_emb(user) * self.item_emb(item)
        return self.head(x if scale is None else x * scale)


def test_keyword_inputs_from_dict_batches_reach_their_parameters():
    """A dict batch gives keyword inputs in its own key order; a parameter it lacks keeps its default."""
    from launcher.parallel.pipeline_graph import _positional

    model = Pair()
    batch = {"item": torch.tensor([1, 2]), "user": torch.tensor([3, 4])}
    plan = _plan(("user_emb", "item_emb", "head"), "item_emb", split="graph")
    cut = cut_model(model, plan, batch)
    assert cut.live == [["user_emb"]] and cut.fed == [[], ["item"]]
    assert fed_positions(cut, 1, batch) == (0,)  # item: first in the batch's key order
    first, second = (stage_module(model, cut, s.index, s.layers, "auto") for s in plan.stages)
    _positional(first, tuple(batch))  # the engine passes a dict's values in its key order
    assert torch.equal(second(*first(*batch.values()), batch["item"]), model(**batch))


@dataclass
class Bag:
    """Ids with per-sample lengths, read by value to pool them (as a KeyedJaggedTensor's are): not on meta."""

    ids: torch.Tensor
    lengths: torch.Tensor

    def to(self, device):
        return Bag(self.ids.to(device), self.lengths.to(device))


class Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(40, 4, mode="sum")

    def forward(self, bag: Bag) -> torch.Tensor:
        offsets = torch.tensor([0, *itertools.accumulate(bag.lengths.tolist())][:-1], device=bag.ids.device)
        return self.bag(bag.ids, offsets)


class Prep(nn.Module):
    """A layer whose output is no tensor."""

    def forward(self, bag: Bag) -> Bag:
        return Bag(bag.ids % 40, bag.lengths)


class BagNet(nn.Module):
    def __init__(self, frozen: bool = False) -> None:
        super().__init__()
        self.dense_net = nn.Linear(3, 4).requires_grad_(not frozen)
        self.prep = Prep()
        self.pooled = Pooled()
        self.head = nn.Linear(8, 1)

    def forward(self, dense, bag):
        return self.head(torch.cat([self.dense_net(dense), self.pooled(self.prep(bag))], dim=1)).squeeze(-1)


def _bag_batch():
    return (torch.randn(2, 3), Bag(torch.tensor([1, 2, 3]), torch.tensor([1, 2]))), torch.zeros(2)


def test_an_input_that_is_no_tensor_is_taken_on_stage_0_and_shaped_on_the_cpu_without_its_table():
    (dense, bag), _ = _bag_batch()
    plan = _plan(("dense_net", "prep", "pooled", "head"), "head", split="graph")
    spec = {"_target_": f"{__name__}.BagNet", "frozen": True}
    io = graph_io(spec, plan, (dense, bag), "auto", torch.float32)  # meta cannot run it: on the CPU
    assert isinstance(io[0][0][1], Bag)  # stage 0 takes the batch's inputs as they are
    # what it sends needs a gradient back: the rows of the table (never made) it pooled do
    assert [(tuple(t.shape), t.requires_grad) for t in io[0][1]] == [((2, 8), True)]
    assert [tuple(t.shape) for t in io[1][1]] == [(2,)]


def test_a_cut_that_would_send_a_value_that_is_no_tensor_is_refused_before_launch_with_one_that_works():
    """The Bag a layer makes cannot cross a boundary; the batch's own Bag may be used on any stage (each reads it
    from the micro-batch)."""
    with torch.device("meta"):
        model = BagNet()
    facts = model_facts_on_meta(model)
    problems, split, order, barred = check_pipeline({"_target_": f"{__name__}.BagNet"}, model, _bag_batch(), "x.yaml",
                                                    _parallel(), "auto", facts)
    assert not problems and split == "graph" and order == ("dense_net", "prep", "pooled", "head")
    assert barred == (("pooled", "the output of layer prep (a Bag) would cross into it from the stage before, to "
                                 "layer pooled"),)
    plan, _ = plan_pipeline(2, 2, {"prep": 1}, "parameters", order, facts.layer_params, (), uncuttable=barred)
    assert [s.layers for s in plan.stages] == [("dense_net",), ("prep", "pooled", "head")]  # the input is fed
    _, problems = plan_pipeline(2, 2, {"pooled": 1}, "parameters", order, facts.layer_params, (), uncuttable=barred)
    assert problems == [
        "parallel.stages: stage 1 cannot begin at layer pooled: the output of layer prep (a Bag) would cross into it "
        "from the stage before, to layer pooled, and pipeline stages send each other tensors only. Begin stage 1 where only "
        "tensors cross: at prep, head ('+parallel.stages={prep: 1}'), or set parallel.pipeline_stages=1."]


class Sized(nn.Module):
    """A branch on a shape (torch.fx cannot record it, torch.export can), an input no layer uses and one that only
    the product after ``b`` takes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 1)

    def forward(self, x, unused, scale):
        if x.shape[0] > 0:
            x = self.a(x)
        return self.c(self.b(x) * scale)


def test_torch_s_tracer_takes_stage_0_s_inputs_by_name_and_refuses_one_a_later_stage_needs():
    inputs = (torch.randn(2, 3), torch.randn(2, 5), torch.rand(2, 1))
    io, _ = stage_io({"_target_": f"{__name__}.Sized"}, _plan(("a", "b", "c"), "c"), inputs, "auto", torch.float32)
    assert [tuple(t.shape) for t in io[0][1]] == [(2, 3)]  # stage 0 took x and scale of the three
    with torch.device("meta"):
        model = Sized()
    problems, split, _, _ = check_pipeline({"_target_": f"{__name__}.Sized"}, model, (inputs, torch.zeros(2, 1)),
                                           "x.yaml", _parallel(b=1), "auto", model_facts_on_meta(model))
    assert split == "trace" and problems == [
        "parallel.pipeline_stages=2: model (x.yaml) is cut by torch's pipeline tracer (torch.fx cannot record its "
        "forward: symbolically traced variables cannot be used as inputs to control flow), which hands the batch's "
        "inputs to stage 0 only, and input scale is first needed on stage 1 (from layer b on). Begin stage 1 after the "
        "layer that takes scale, or set parallel.pipeline_stages=1."]
