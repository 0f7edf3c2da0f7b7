"""The generic table lookup: a model whose nn.Embedding / nn.EmbeddingBag tables are swapped for TableLookup
modules computes the same outputs and the same row gradients as the untouched model (one process, no engine)."""

import copy

import pytest
import torch
from torch import nn

from launcher.plan import TablePlan
from launcher.tables import ReplicatedTables, TableLookup, build_tables


class Towers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = nn.Embedding(50, 4, padding_idx=0)
        self.towers = nn.ModuleList([nn.ModuleDict({"item": nn.EmbeddingBag(40, 3, mode="mean")})])
        self.bag_sum = nn.EmbeddingBag(30, 2, mode="sum")
        self.head = nn.Linear(4 + 3 + 2, 1)

    def forward(self, user, items, tags, tag_offsets, tag_weights):
        parts = [self.user(user).sum(1), self.towers[0]["item"](items),
                 self.bag_sum(tags, tag_offsets, per_sample_weights=tag_weights)]
        return self.head(torch.cat(parts, dim=1)).squeeze(-1)


def _plan(name: str, rows: int, dim: int) -> TablePlan:
    return TablePlan(name=name, rows=rows, dim=dim, location="host", optimizer="lazy_adam", lr=0.1,
                     betas=(0.9, 0.999), eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)


def _batch():
    g = torch.Generator().manual_seed(1)
    user = torch.randint(0, 50, (6, 3), generator=g)
    user[0, 0] = 0  # the padding row: no gradient
    items = torch.randint(0, 40, (6, 5), generator=g)
    tags = torch.randint(0, 30, (11,), generator=g)
    offsets = torch.tensor([0, 2, 2, 5, 7, 9])  # bag 2 is empty
    return user, items, tags, offsets, torch.rand(11, generator=g)


def test_swapped_tables_give_the_same_outputs_and_row_gradients():
    torch.manual_seed(0)
    model = Towers()
    swapped = copy.deepcopy(model)
    names = {"user": (50, 4), "towers.0.item": (40, 3), "bag_sum": (30, 2)}
    tables = build_tables([swapped], tuple(_plan(n, *s) for n, s in names.items()), torch.device("cpu"), torch.float32)
    assert isinstance(swapped.towers[0]["item"], TableLookup) and not any("user" in n for n, _ in swapped.named_parameters())
    batch = _batch()
    out, out_swapped = model(*batch), swapped(*batch)
    assert torch.allclose(out, out_swapped, atol=1e-6)
    out.square().sum().backward()
    out_swapped.square().sum().backward()
    tables.collect()
    grads = {names: rows_values for names, rows_values in tables._grads.items()}
    for name in names:
        (rows, (values,)), = grads[(name,)]  # one micro-batch: its rows, each table's gradient of the group
        dense = torch.zeros(names[name]).index_add_(0, rows, values)
        assert torch.allclose(dense, model.get_submodule(name).weight.grad, atol=1e-6), name
    assert torch.allclose(swapped.head.weight.grad, model.head.weight.grad, atol=1e-6)


def test_lookups_under_no_grad_leave_nothing_to_collect():
    model = Towers()
    tables = build_tables([model], (_plan("user", 50, 4),), torch.device("cpu"), torch.float32)
    with torch.no_grad():
        model(*_batch())
    tables.collect()
    assert tables.step() and tables.tables["user"].optimizer.steps == 0


def test_a_path_that_is_not_a_table_is_refused():
    with pytest.raises(TypeError, match="head cannot train outside the parallel parts: it is a Linear, not an nn.Embedding"):
        build_tables([Towers()], (_plan("head", 9, 1),), torch.device("cpu"), torch.float32)


def test_a_table_looked_up_twice_in_one_forward_steps_once_with_the_summed_gradient():
    torch.manual_seed(0)
    emb, other = nn.Embedding(10, 3), nn.Embedding(10, 2)
    ids = torch.tensor([1, 2, 2, 7])
    reference = copy.deepcopy(emb)
    tables = ReplicatedTables({"emb": emb.weight.detach().clone(), "other": other.weight.detach().clone()},
                      (_plan("emb", 10, 3), _plan("other", 10, 2)), torch.device("cpu"))
    # emb twice with the same ids tensor, once grouped with other: one lazy Adam step for emb, on the summed gradient
    a, b, c = tables.lookup("emb", ids), tables.lookup("other", ids), tables.lookup("emb", ids)
    (a.square().sum() + 2 * c.sum() + b.sum()).backward()
    ref = reference(ids)
    (ref.square().sum() + 2 * reference(ids).sum()).backward()
    tables.collect()
    assert tables.step()
    assert tables.tables["emb"].optimizer.steps == 1 and tables.tables["other"].optimizer.steps == 1
    expect = torch.optim.SparseAdam([nn.Parameter(reference.weight.detach().clone())], lr=0.1)
    p = expect.param_groups[0]["params"][0]
    p.grad = reference.weight.grad.to_sparse()  # torch's SparseAdam = lazy Adam, on the reference's summed gradient
    expect.step()
    assert torch.allclose(tables.tables["emb"].weight, p.detach(), atol=1e-6)


class Scaled(nn.Embedding):
    """As Gemma's scaled word embedding: its own forward, which a lookup would not run."""

    def forward(self, input):  # noqa: A002
        return super().forward(input) * 8.0


@pytest.mark.parametrize("module, why", [
    (Scaled(5, 2), "has a forward of its own"),
    (nn.Embedding(5, 2).requires_grad_(False), "frozen"),
    (nn.Embedding(5, 2, scale_grad_by_freq=True), "scale_grad_by_freq"),
    (nn.Embedding(5, 2, max_norm=1.0), "max_norm"),
])
def test_embeddings_the_lookup_cannot_reproduce_stay_in_the_engine(module, why):
    from launcher.facts.model import model_facts_on_meta

    model = nn.ModuleDict({"t": module, "ok": nn.Embedding(5, 2)})
    facts = model_facts_on_meta(model)
    assert list(facts.tables) == ["ok"] and why in facts.lines[-1]
    with pytest.raises(TypeError, match=f"t cannot train outside the parallel parts: .*{why}"):
        build_tables([model], (_plan("t", 5, 2),), torch.device("cpu"), torch.float32)


def test_a_2d_bag_input_with_offsets_is_refused_as_torch_does():
    model = nn.ModuleDict({"bag": nn.EmbeddingBag(5, 2)})
    build_tables([model], (_plan("bag", 5, 2),), torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="offsets has to be None"):
        model["bag"](torch.tensor([[1, 2]]), torch.tensor([0]))
