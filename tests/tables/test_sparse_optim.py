"""Row-sparse optimizers: the published update rule on touched rows, and untouched rows left bit-identical."""

import pytest
import torch

from launcher.tables.sparse_optim import LazyAdam, SparseAdam, SparseFTRL


def ftrl_reference(w, n, z, g, lr, l1, l2, lr_power):
    """FTRL-Proximal (McMahan et al. 2013; TensorFlow ApplyFtrl) on dense tensors, written from the formula."""
    n_new = n + g**2
    sigma = (n_new ** (-lr_power) - n ** (-lr_power)) / lr
    z = z + g - sigma * w
    quad = n_new ** (-lr_power) / lr + 2 * l2
    w = torch.where(z.abs() > l1, (torch.sign(z) * l1 - z) / quad, torch.zeros_like(z))
    return w, n_new, z


@pytest.mark.parametrize("l1, l2, lr_power", [(0.0, 0.0, -0.5), (0.01, 0.1, -0.5), (0.001, 0.0, -0.3)])
def test_ftrl_matches_reference_on_touched_rows_and_leaves_the_rest(l1, l2, lr_power):
    torch.manual_seed(0)
    weight = torch.randn(50, 4) * 0.1
    before = weight.clone()
    opt = SparseFTRL(weight, lr=0.05, l1=l1, l2=l2, lr_power=lr_power, initial_accumulator=0.5)
    w_ref, n_ref, z_ref = before.clone(), torch.full_like(before, 0.5), torch.zeros_like(before)
    for step in range(5):
        rows = torch.tensor(sorted({3, 7, 11 + step, 20}))
        grads = torch.randn(len(rows), 4)
        opt.step(rows, grads)
        w_r, n_r, z_r = ftrl_reference(w_ref[rows], n_ref[rows], z_ref[rows], grads, 0.05, l1, l2, lr_power)
        w_ref[rows], n_ref[rows], z_ref[rows] = w_r, n_r, z_r
    torch.testing.assert_close(weight, w_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(opt.accum, n_ref)
    torch.testing.assert_close(opt.linear, z_ref)
    touched = {3, 7, 11, 12, 13, 14, 15, 20}
    untouched = torch.tensor([r for r in range(50) if r not in touched])
    assert torch.equal(weight[untouched], before[untouched])  # bit-identical
    assert torch.equal(opt.accum[untouched], torch.full((len(untouched), 4), 0.5))
    assert torch.equal(opt.linear[untouched], torch.zeros(len(untouched), 4))


def test_ftrl_strong_l1_zeroes_weights():
    weight = torch.ones(10, 2)
    opt = SparseFTRL(weight, lr=0.1, l1=100.0)
    opt.step(torch.tensor([1, 2]), torch.full((2, 2), 0.5))
    assert torch.equal(weight[1:3], torch.zeros(2, 2)) and torch.equal(weight[3:], torch.ones(7, 2))


@pytest.mark.parametrize("kind", [LazyAdam, SparseAdam])
def test_lazy_adam_matches_torch_sparse_adam_and_touches_only_batch_rows(kind):
    torch.manual_seed(1)
    weight = torch.randn(40, 3)
    before = weight.clone()
    ref = torch.nn.Parameter(weight.clone())
    ref_opt = torch.optim.SparseAdam([ref], lr=0.01)
    opt = kind(weight, lr=0.01)
    for step in range(6):
        rows = torch.tensor([2, 5 + step, 30])
        grads = torch.randn(3, 3)
        opt.step(rows, grads)
        ref.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grads, ref.shape, check_invariants=True)
        ref_opt.step()
    if kind is SparseAdam:
        assert torch.equal(weight, ref.detach())
    else:  # the same update, computed row-wise: equal up to float rounding
        torch.testing.assert_close(weight, ref.detach(), rtol=1e-6, atol=1e-7)
    untouched = torch.tensor([r for r in range(40) if r not in {2, 5, 6, 7, 8, 9, 10, 30}])
    assert torch.equal(weight[untouched], before[untouched])
    for state in opt.state_tensors():
        assert torch.count_nonzero(state[untouched]) == 0


def test_lazy_adam_differs_from_dense_adam_on_rows_without_gradient():
    # Guards the test above: dense Adam keeps moving rows with momentum after their gradient stops; lazy Adam does not.
    weight = torch.zeros(4, 1)
    lazy = LazyAdam(weight, lr=0.1)
    dense_w = torch.nn.Parameter(torch.zeros(4, 1))
    dense = torch.optim.Adam([dense_w], lr=0.1)
    lazy.step(torch.tensor([0]), torch.ones(1, 1))
    dense_w.grad = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    dense.step()
    lazy.step(torch.tensor([1]), torch.ones(1, 1))
    dense_w.grad = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    dense.step()
    assert weight[0].item() != dense_w[0].item()
