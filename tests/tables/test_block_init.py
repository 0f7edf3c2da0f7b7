"""Split tables built by blocks (placement.ps_init=blocks): the model's tables are made on the meta device while it
is built, their initialisation is recorded and replayed on a rank's rows only, chunk by chunk with chunk-seeded
draws, so the rows do not depend on how they are split; an initialisation that cannot be replayed is refused with
the fix."""

import pytest
import torch
from torch import nn

from launcher.tables.block_init import CHUNK, BlockInitError, DeferredTables, init_blocks
from launcher.tables.partition import RowPartition

ROWS = CHUNK + 1000  # two chunks, the second partial


class UserModel(nn.Module):
    def __init__(self, init=None) -> None:
        super().__init__()
        self.emb = nn.Embedding(ROWS, 8, padding_idx=3)
        self.bag = nn.EmbeddingBag(ROWS, 4)
        self.wide = nn.Embedding(ROWS, 1)
        self.head = nn.Linear(13, 1)
        nn.init.normal_(self.emb.weight, std=0.01)
        nn.init.xavier_uniform_(self.bag.weight)
        nn.init.zeros_(self.wide.weight)
        if init is not None:
            init(self.emb.weight)


def _blocks(parts: int, rank: int, model_init=None) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    deferred = DeferredTables({(ROWS, 8), (ROWS, 4), (ROWS, 1)})
    with deferred:
        model = UserModel(model_init)
    modules = {"emb": model.emb, "bag": model.bag, "wide": model.wide}
    bounds = {n: RowPartition(ROWS, parts).bounds(rank) for n in modules}
    return model, init_blocks(model, deferred, modules, bounds, seed=7)


def test_tables_are_never_whole_and_their_rows_do_not_depend_on_the_split():
    model, whole = _blocks(1, 0)
    assert model.emb.weight.is_meta and model.bag.weight.is_meta and not model.head.weight.is_meta
    for parts in (2, 3):
        split = [_blocks(parts, r)[1] for r in range(parts)]
        for name in whole:
            assert [len(b[name]) for b in split] == [RowPartition(ROWS, parts).owned(r) for r in range(parts)]
            assert torch.equal(torch.cat([b[name] for b in split]), whole[name])
    assert whole["emb"].std().item() == pytest.approx(0.01, rel=0.05)  # the model's own init, replayed
    assert whole["emb"][3].abs().max() > 0  # padding_idx's row: zeroed by nn.Embedding, drawn again by normal_
    bound = (6 / (ROWS + 4)) ** 0.5  # xavier_uniform_'s, from the table's whole shape
    assert whole["bag"].abs().max().item() <= bound and whole["bag"].abs().max().item() > 0.9 * bound
    assert torch.equal(whole["wide"], torch.zeros(ROWS, 1))
    assert not torch.equal(whole["emb"][:CHUNK], whole["emb"][1000:CHUNK + 1000])  # chunks draw their own rows


@pytest.mark.parametrize("init", [lambda w: nn.init.orthogonal_(w), lambda w: nn.init.trunc_normal_(w),
                                  lambda w: w.data.copy_(torch.ones(ROWS, 8)),
                                  lambda w: nn.init.kaiming_uniform_(w, mode="fan_out"),
                                  lambda w: w.data[torch.tensor([1, 2])].fill_(0)])
def test_an_initialisation_that_cannot_be_replayed_is_refused_with_the_fix(init):
    with pytest.raises(BlockInitError, match=r"placement.ps_init=whole"):
        _blocks(2, 0, init)


def test_initialisation_through_data_views_and_row_slices_is_replayed():
    """w.data.uniform_, w.detach().mul_, w.data[a:b] = 0, w[i].fill_ and kaiming_uniform_ (fan_in): the blocks
    equal the same calls made on a whole table built the same way, chunk by chunk."""
    def init(w):
        w.data.uniform_(-0.05, 0.05)
        w.detach().mul_(2.0)
        w.data[10:20] = 0.5
        w.data[-1].fill_(7.0)

    _, whole = _blocks(1, 0, init)
    emb = whole["emb"]
    assert emb.abs()[20:-1].max().item() <= 0.1 and emb.abs()[20:-1].max().item() > 0.09
    assert torch.equal(emb[10:20], torch.full((10, 8), 0.5)) and torch.equal(emb[-1], torch.full((8,), 7.0))
    assert emb[3].abs().max() > 0  # padding_idx's row: zeroed by nn.Embedding, then drawn again by init (as whole)
    split = [_blocks(3, r, init)[1]["emb"] for r in range(3)]
    assert torch.equal(torch.cat(split), emb)
    _, kaiming = _blocks(2, 1, lambda w: nn.init.kaiming_uniform_(w))
    assert kaiming["emb"].abs().max().item() <= (6 / 8) ** 0.5  # fan_in = dim, whatever the rows


def test_a_linear_layer_of_a_tables_shape_is_not_deferred():
    deferred = DeferredTables({(ROWS, 8)})
    with deferred:
        head = nn.Linear(8, ROWS)  # weight (ROWS, 8): the shape of a table, not a table
    assert not head.weight.is_meta


def test_nn_embeddings_own_init_zeroes_its_padding_row():
    deferred = DeferredTables({(ROWS, 8)})
    with deferred:
        emb = nn.Embedding(ROWS, 8, padding_idx=CHUNK + 5)  # in the second chunk
    block = init_blocks(emb, deferred, {"emb": emb}, {"emb": (CHUNK, ROWS)}, seed=7)["emb"]
    assert torch.equal(block[5], torch.zeros(8)) and block.std().item() == pytest.approx(1.0, rel=0.05)
