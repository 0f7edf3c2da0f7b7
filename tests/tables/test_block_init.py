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
    assert torch.equal(whole["emb"][3], torch.zeros(8))  # padding_idx
    bound = (6 / (ROWS + 4)) ** 0.5  # xavier_uniform_'s, from the table's whole shape
    assert whole["bag"].abs().max().item() <= bound and whole["bag"].abs().max().item() > 0.9 * bound
    assert torch.equal(whole["wide"], torch.zeros(ROWS, 1))
    assert not torch.equal(whole["emb"][:CHUNK], whole["emb"][1000:CHUNK + 1000])  # chunks draw their own rows


@pytest.mark.parametrize("init", [lambda w: nn.init.orthogonal_(w), lambda w: nn.init.trunc_normal_(w),
                                  lambda w: w.data.copy_(torch.ones(ROWS, 8))])
def test_an_initialisation_that_cannot_be_replayed_is_refused_with_the_fix(init):
    with pytest.raises(BlockInitError, match=r"placement.ps_init=whole"):
        _blocks(2, 0, init)
