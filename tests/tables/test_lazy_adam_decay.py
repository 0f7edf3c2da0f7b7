"""Lazy Adam's weight decay on the rows it updates equals torch's Adam (L2) and AdamW (decoupled) when every row is
updated every step (what runtime.prepare() gives a host table from your Adam/AdamW group)."""

import pytest
import torch

from launcher.tables.sparse_optim import LazyAdam


@pytest.mark.parametrize("torch_opt, decoupled", [(torch.optim.Adam, False), (torch.optim.AdamW, True)])
def test_lazy_adam_decay_is_torchs_when_every_row_steps(torch_opt, decoupled):
    torch.manual_seed(0)
    start = torch.randn(5, 3)
    ref = torch.nn.Parameter(start.clone())
    opt = torch_opt([ref], lr=0.1, weight_decay=0.2)
    ours = LazyAdam(start.clone(), lr=0.1, weight_decay=0.2, decoupled_decay=decoupled)
    rows = torch.arange(5)
    for _ in range(4):
        grad = torch.randn(5, 3)
        ref.grad = grad.clone()
        opt.step()
        ours.step(rows, grad.clone())
    assert torch.allclose(ours.weight, ref.detach(), atol=1e-6)
    plain = LazyAdam(start.clone(), lr=0.1)
    plain.step(rows, torch.ones(5, 3))
    assert not torch.allclose(plain.weight, ours.weight)  # the decay did something
