"""Pipeline stages of a user's recommendation model that is no chain of its children (issue 31): seven positional
inputs (user and item ids, a bag of history ids with their weights, a category, dense features, and a scale that only
the last layer's input uses: a skip connection past the first stage), cut from its forward's graph
(launcher/parallel/pipeline_graph.py), trained on 2 pipeline ranks with its tables inside the parts and with its
tables on the host, each against one process per step, and its held-out metrics through the pipeline with a short
last batch. A six-input model whose 1-D bag (ids and offsets: their length changes every batch) is used on stage 1
does the same (issue 43). An input that is no tensor (a bag read by value, as TorchRec's KeyedJaggedTensor is) is
read from the micro-batch by the stage that uses it; a cut that would send such a value, made by a layer, is refused
before launch, naming it and a cut that works.

The project (model, data, YAML) is written to the test's own folder. SGD: a table trained outside the parts takes
torch's SGD step on the rows looked up, so one one-process run is the reference of both layouts.
"""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.test_placement_runs import assert_close, losses

pytestmark = pytest.mark.integration

MODEL = '''
import itertools
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset


class Seven(nn.Module):
    def __init__(self, users=1000, items=500, dim=8, dense=4):
        super().__init__()
        self.user_emb = nn.Embedding(users, dim)
        self.item_emb = nn.Embedding(items, dim)
        self.hist = nn.EmbeddingBag(items, dim, mode="sum")
        self.cat_emb = nn.Embedding(20, dim)
        self.dense_net = nn.Sequential(nn.Linear(dense, dim), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(5 * dim, 16), nn.ReLU())
        self.out = nn.Linear(16 + dense, 1)

    def forward(self, user, item, hist, hist_weights, category, dense, scale):
        h = self.hist(hist, per_sample_weights=hist_weights)
        x = torch.cat([self.user_emb(user), self.item_emb(item), h, self.cat_emb(category), self.dense_net(dense)],
                      dim=1)
        return self.out(torch.cat([self.top(x), dense * scale], dim=1)).squeeze(-1)


class SevenData(Dataset):
    def __init__(self, n=2048, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.user = torch.randint(0, 1000, (n,), generator=g)
        self.item = torch.randint(0, 500, (n,), generator=g)
        self.hist = torch.randint(0, 500, (n, 5), generator=g)
        self.hw = torch.rand(n, 5, generator=g)
        self.cat = torch.randint(0, 20, (n,), generator=g)
        self.dense = torch.randn(n, 4, generator=g)
        self.scale = torch.rand(n, 1, generator=g)
        self.label = torch.bernoulli(torch.sigmoid(self.dense.sum(1)), generator=g)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return (self.user[i], self.item[i], self.hist[i], self.hw[i], self.cat[i], self.dense[i], self.scale[i],
                self.label[i])


@dataclass
class Bag:
    ids: torch.Tensor
    lengths: torch.Tensor

    def to(self, device):
        return Bag(self.ids.to(device), self.lengths.to(device))


class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 4, mode="sum")

    def forward(self, bag):
        offsets = torch.tensor([0, *itertools.accumulate(bag.lengths.tolist())][:-1], device=bag.ids.device)
        return self.bag(bag.ids, offsets)


class Prep(nn.Module):
    def forward(self, bag):
        return Bag(bag.ids % 100, bag.lengths)


class BagNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense_net = nn.Linear(3, 4)
        self.prep = Prep()
        self.pooled = Pooled()
        self.head = nn.Linear(8, 1)

    def forward(self, dense, bag):
        return self.head(torch.cat([self.dense_net(dense), self.pooled(self.prep(bag))], dim=1)).squeeze(-1)


class Bags(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.randn(3), torch.arange(i % 3 + 1) + i % 50, float(i % 2)


class Six(nn.Module):
    """Three embeddings, a 2-D bag, a 1-D bag with offsets (its ids' length changes every batch) and dense features."""

    def __init__(self, dim=8):
        super().__init__()
        self.user_emb = nn.Embedding(1000, dim)
        self.item_emb = nn.Embedding(500, dim)
        self.cat_emb = nn.Embedding(20, dim)
        self.hist = nn.EmbeddingBag(500, dim, mode="mean")
        self.tags = nn.EmbeddingBag(300, dim, mode="sum")
        self.top = nn.Sequential(nn.Linear(5 * dim + 4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user, item, category, hist, tag_ids, tag_offsets, dense):
        x = torch.cat([self.user_emb(user), self.item_emb(item), self.cat_emb(category), self.hist(hist),
                       self.tags(tag_ids, tag_offsets), dense], dim=1)
        return self.top(x).squeeze(-1)


class SixData(Dataset):
    def __init__(self, n=2048, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.rows = [(torch.randint(0, 1000, (), generator=g), torch.randint(0, 500, (), generator=g),
                      torch.randint(0, 20, (), generator=g), torch.randint(0, 500, (4,), generator=g),
                      torch.randint(0, 300, (int(torch.randint(1, 6, ())),), generator=g), torch.randn(4, generator=g))
                     for _ in range(n)]
        self.label = torch.bernoulli(torch.sigmoid(torch.stack([r[5].sum() for r in self.rows])), generator=g)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return (*self.rows[i], self.label[i])


class Keep(nn.Module):
    def forward(self, ids):
        return ids[ids % 2 == 0]  # as many ids as are even: a length that depends on the batch's content


class VarNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense_net = nn.Linear(3, 4)
        self.keep = Keep()
        self.bag = nn.EmbeddingBag(100, 4, mode="sum")
        self.head = nn.Linear(8, 1)

    def forward(self, dense, ids):
        pooled = self.bag(self.keep(ids).view(1, -1)).expand(dense.shape[0], -1)
        return self.head(torch.cat([self.dense_net(dense), pooled], dim=1)).squeeze(-1)


class VarData(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, generator=g), torch.randint(0, 100, (3,), generator=g), float(i % 2)


class Pool(nn.Module):
    def forward(self, rows, ids):
        mask = (ids > 0).unsqueeze(-1).float()  # 0 pads a list to the batch's longest
        return (rows * mask).sum(1) / mask.sum(1).clamp(min=1)


class PadNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq_emb = nn.Embedding(100, 8, padding_idx=0)
        self.pool = Pool()
        self.head = nn.Linear(8 + 3, 1)

    def forward(self, dense, ids):
        return self.head(torch.cat([self.pool(self.seq_emb(ids), ids), dense], dim=1)).squeeze(-1)


class PadData(Dataset):
    def __init__(self, n=200, seed=0):
        g = torch.Generator().manual_seed(seed)
        longest = torch.where(torch.rand(n, generator=g) < 0.1, 12, 3)  # mostly short lists, now and then a long one
        self.rows = [(torch.randn(3, generator=g),
                      torch.randint(1, 100, (int(torch.randint(1, int(m) + 1, (), generator=g)),), generator=g))
                     for m in longest]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        dense, ids = self.rows[i]
        return dense, ids, float(ids.sum() % 3 == 0)


def padded(items):
    """Each loader batch's lists padded to its longest: the ids' width, and the (rows, width, 8) embeddings that stage
    0 sends, change from one micro-batch to the next."""
    width = max(len(it[1]) for it in items)
    ids = torch.stack([torch.nn.functional.pad(it[1], (0, width - len(it[1]))) for it in items])
    return torch.stack([it[0] for it in items]), ids, torch.tensor([it[2] for it in items])


def six_batch(items):
    tags = [it[4] for it in items]
    offsets = torch.tensor([0, *itertools.accumulate(len(t) for t in tags)][:-1])
    return (torch.stack([it[0] for it in items]), torch.stack([it[1] for it in items]),
            torch.stack([it[2] for it in items]), torch.stack([it[3] for it in items]), torch.cat(tags), offsets,
            torch.stack([it[5] for it in items]), torch.stack([it[6] for it in items]))


def bags(items):
    ids = [it[1] for it in items]
    return (torch.stack([it[0] for it in items]), Bag(torch.cat(ids), torch.tensor([len(x) for x in ids])),
            torch.tensor([it[2] for it in items]))
'''

def recipe(name: str, model: str, data: str, *lines: str, held_out: bool = False) -> str:
    """A recipe file of this project: ``name``, its model and data classes (recsys7.model), BCE loss, ``lines``."""
    head = ["# @package _global_", f"recipe: {{name: {name}}}", f"model: {{_target_: recsys7.model.{model}}}",
            f"data: {{_target_: recsys7.model.{data}}}"]
    held = [f"eval_data: {{_target_: recsys7.model.{data}, n: 250, seed: 1}}"] if held_out else []
    return "\n".join([*head, *held, "loss: {_target_: torch.nn.BCEWithLogitsLoss}", *lines]) + "\n"


STEPS_8 = ("optimizer: {name: sgd, lr: 0.5}", "trainer: {steps: 8, log_every: 1, checkpoint_every: -1}",
           "batch: {global_size: 64, micro_batches: 2}")
SEVEN = recipe("seven", "Seven", "SevenData", *STEPS_8, held_out=True)
SIX = recipe("six", "Six", "SixData", "loader: {collate_fn: recsys7.model.six_batch}", *STEPS_8, held_out=True)
VARNET = recipe("varnet", "VarNet", "VarData", "trainer: {steps: 4}", "batch: {global_size: 32, micro_batches: 2}")
BAGNET = recipe("bagnet", "BagNet", "Bags", "loader: {collate_fn: recsys7.model.bags}", "trainer: {steps: 2}")
PADNET = recipe("padnet", "PadNet", "PadData", "loader: {collate_fn: recsys7.model.padded}", *STEPS_8[:2],
                "batch: {global_size: 32, micro_batches: 2}", held_out=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recsys7")
    (root / "recsys7").mkdir()
    (root / "recsys7" / "__init__.py").write_text("")
    (root / "recsys7" / "model.py").write_text(MODEL)
    (root / "conf" / "recipe").mkdir(parents=True)
    (root / "conf" / "recipe" / "seven.yaml").write_text(SEVEN)
    (root / "conf" / "recipe" / "bagnet.yaml").write_text(BAGNET)
    (root / "conf" / "recipe" / "six.yaml").write_text(SIX)
    (root / "conf" / "recipe" / "varnet.yaml").write_text(VARNET)
    (root / "conf" / "recipe" / "padnet.yaml").write_text(PADNET)
    return root


def train(project: Path, name: str, overrides: list[str], recipe: str = "seven") -> Path:
    res = run_cli(["--config-dir", "conf", f"recipe={recipe}", f"output.run_name={name}", *overrides], project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return project / "log_output" / name


def test_seven_inputs_on_two_stages_match_one_process_with_device_and_host_tables(project):
    one = train(project, "one", ["cluster.nproc_per_node=1"])
    device = train(project, "pp2", ["parallel.pipeline_stages=2"])
    host = train(project, "pp2_host", ["parallel.pipeline_stages=2", "placement.host_device_mix=1"])
    plan = json.loads((host / "plan.json").read_text())
    assert plan["pipeline"]["split"] == "graph" and [p["name"] for p in plan["parts"]] == ["ddp", "pipeline"]
    assert [s["layers"] for s in plan["pipeline"]["stages"]] == [["hist", "user_emb"], [  # the forward's order
        "item_emb", "cat_emb", "dense_net", "top", "out"]]
    assert {t["location"] for t in plan["placement"]["tables"]} == {"host"}
    stage1 = json.loads((host / "rank.1" / "memory.json").read_text())["tables"]
    assert set(stage1) == {"item_emb", "cat_emb"}  # each stage's tables live with its rank
    reference = losses(one)
    assert len(reference) == 8 and reference[-1] < reference[0]
    evals = {}
    for run in (one, device, host):
        assert_close(reference, losses(run), rel=1e-5)
        evals[run.name] = json.loads((run / "summary.json").read_text())["eval"]
    for name in ("pp2", "pp2_host"):  # 250 held-out items: 7 micro-batches of 32 and one of 26 through the stages
        assert evals[name]["n"] == 250 and abs(evals[name]["auc"] - evals["one"]["auc"]) <= 1e-6, evals
        assert abs(evals[name]["loss"] - evals["one"]["loss"]) <= 1e-5 * evals["one"]["loss"], evals


def test_six_inputs_with_a_1d_bag_on_stage_1_train_and_evaluate_as_one_process(project):
    """The 1-D bag's ids change length every micro-batch and the held-out set ends on a short batch (250 = 7 × 32 +
    26): stage 1 reads the batch's inputs from the micro-batch it runs (nothing of variable shape is sent), and the
    short batch runs through stages shaped for it."""
    one = train(project, "six_one", ["cluster.nproc_per_node=1"], "six")
    runs = [train(project, "six_pp2", ["parallel.pipeline_stages=2", "+parallel.stages={hist: 1}"], "six"),
            train(project, "six_pp2_host", ["parallel.pipeline_stages=2", "+parallel.stages={hist: 1}",
                                            "placement.host_device_mix=1"], "six")]
    plan = json.loads((runs[1] / "plan.json").read_text())
    assert [s["layers"] for s in plan["pipeline"]["stages"]] == [["user_emb", "item_emb", "cat_emb"],
                                                                 ["hist", "tags", "top"]]
    assert {t["name"]: t["location"] for t in plan["placement"]["tables"]}["tags"] == "host"
    reference = losses(one)
    assert len(reference) == 8 and reference[-1] < reference[0]
    want = json.loads((one / "summary.json").read_text())["eval"]
    for run in runs:
        assert_close(reference, losses(run), rel=1e-5)
        got = json.loads((run / "summary.json").read_text())["eval"]
        assert got["n"] == 250 and abs(got["auc"] - want["auc"]) <= 1e-6, (got, want)
        assert abs(got["loss"] - want["loss"]) <= 1e-5 * want["loss"], (got, want)


def test_the_batch_s_own_bag_reaches_stage_1_and_a_cut_that_would_send_a_bag_is_refused_before_launch(project):
    """A Bag the batch gives is read from the micro-batch on any stage; a Bag a layer makes cannot cross."""
    run = train(project, "bag_pp2", ["parallel.pipeline_stages=2", "+parallel.stages={prep: 1}"], "bagnet")
    assert len(losses(run)) == 2
    res = run_cli(["--config-dir", "conf", "recipe=bagnet", "parallel.pipeline_stages=2",
                   "+parallel.stages={pooled: 1}"], project)
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    out = " ".join((res.stdout + res.stderr).split())
    assert ("parallel.stages: stage 1 cannot begin at layer pooled: the output of layer prep (a Bag) would cross into "
            "it from the stage before, to layer pooled, and pipeline stages send each other tensors only. Begin stage "
            "1 where only tensors cross: at prep, head ('+parallel.stages={prep: 1}'), or set "
            "parallel.pipeline_stages=1.") in out, out


def test_a_value_whose_shape_depends_on_the_batch_crossing_a_boundary_is_named(project):
    """A layer's output of another length every micro-batch (the even ids) sent to the next stage: the rank says
    which stage, which output and what to do, instead of a receive of the wrong size."""
    res = run_cli(["--config-dir", "conf", "recipe=varnet", "parallel.pipeline_stages=2", "+parallel.stages={bag: 1}",
                   "output.run_name=varnet"], project)
    out = " ".join((res.stdout + res.stderr).replace("│", " ").split())
    assert res.returncode == 1, out[-3000:]
    assert "pipeline stage 0 sends a (" in out and "its shape depends on the batch's values" in out, out[-3000:]


def test_values_whose_length_follows_the_inputs_cross_a_boundary_and_train_as_one_process(project):
    """Each micro-batch's lists padded to its longest (a width of 1-12): stage 0 sends (16, width, 8) embeddings, whose
    width changes from one micro-batch to the next, within a step too. Each shape of inputs runs through stages
    shaped for it (a step whose two micro-batches differ runs each as a schedule of its own), in training and in
    the held-out set (250 = 7 x 32 + 26: a short last batch), as one process does."""
    one = train(project, "pad_one", ["cluster.nproc_per_node=1"], "padnet")
    pp = train(project, "pad_pp2", ["parallel.pipeline_stages=2", "+parallel.stages={pool: 1}"], "padnet")
    assert [s["layers"] for s in json.loads((pp / "plan.json").read_text())["pipeline"]["stages"]] == [
        ["seq_emb"], ["pool", "head"]]
    reference = losses(one)
    assert len(reference) == 8
    assert_close(reference, losses(pp), rel=1e-5)
    want, got = (json.loads((run / "summary.json").read_text())["eval"] for run in (one, pp))
    assert got["n"] == 250 and abs(got["auc"] - want["auc"]) <= 1e-6, (got, want)
    assert abs(got["loss"] - want["loss"]) <= 1e-5 * want["loss"], (got, want)
