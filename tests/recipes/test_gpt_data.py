"""gpt recipe: the Markov source's entropy and floor, its stream, and the model's stages and sizes."""

import math

import pytest
import torch

from launcher.recipes.gpt import markov
from launcher.recipes.gpt.data import MarkovTokens
from launcher.recipes.gpt.model import GPT, NextTokenLoss
from launcher.recipes.gpt.sizes import param_count

SOURCE = dict(vocab_size=16, seq_len=32, candidates=4, skew=1.0, seed=3)
MODEL = dict(vocab_size=16, seq_len=32, layers=2, width=32, heads=4, mlp_ratio=4, dropout=0.0)


def take(stream, n):
    return [next(stream) for _ in range(n)]


def test_profile_entropy_and_floor():
    p = markov.profile(4, 1.0)
    assert sum(p) == pytest.approx(1.0) and p == sorted(p, reverse=True)
    assert p[0] / p[3] == pytest.approx(4.0)  # p_i proportional to i^-skew
    assert markov.entropy(markov.profile(5, 0.0)) == pytest.approx(math.log(5))
    assert markov.uniform_loss(32) == pytest.approx(math.log(32))
    # S=3: one prediction at ln V and one at H(profile).
    assert markov.entropy_floor(32, 3, 4, 0.0) == pytest.approx((math.log(32) + math.log(4)) / 2)


def test_empirical_conditional_entropy_is_the_profile_entropy():
    """Plug-in H(X_t | X_{t-2}, X_{t-1}) from counted transitions, not from the source's own table."""
    source = MarkovTokens(vocab_size=8, seq_len=64, candidates=4, skew=1.0, seed=0)
    seqs = source.sequences(1024, torch.Generator().manual_seed(0))
    v = source.vocab_size
    triples = (seqs[:, :-2] * v + seqs[:, 1:-1]) * v + seqs[:, 2:]
    counts = torch.bincount(triples.reshape(-1), minlength=v**3).view(v * v, v).double()
    assert ((counts > 0).sum(1) == 4).all()  # exactly K candidates per context
    conditional = counts / counts.sum(1, keepdim=True)
    plug_in = -(counts * torch.where(counts > 0, conditional.log(), 0.0)).sum() / counts.sum()
    assert plug_in.item() == pytest.approx(markov.entropy(markov.profile(4, 1.0)), rel=0.02)


def test_true_model_loss_is_the_entropy_and_the_floor():
    source = MarkovTokens(**SOURCE)
    nll = torch.cat([source.true_nll(x, y) for (x,), y in source.eval_batches(0, 1, 256, 4)])
    assert torch.isfinite(nll).all()  # every transition is one of its context's candidates
    assert (nll[:, 0] == math.log(16)).all()
    h = markov.entropy(markov.profile(4, 1.0))
    assert nll[:, 1:].mean().item() == pytest.approx(h, rel=0.02)
    floor = markov.entropy_floor(16, 32, 4, 1.0)
    assert nll.mean().item() == pytest.approx(floor, rel=0.02)


def test_items_are_shifted_int64_sequences():
    (tokens,), labels = next(MarkovTokens(**SOURCE).train_batches(1, 2, 5, seed=0))
    assert tokens.shape == labels.shape == (5, 31) and tokens.dtype == labels.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], labels[:, :-1])
    assert 0 <= tokens.min() and labels.max() < 16


def test_stream_does_not_depend_on_the_split():
    source = MarkovTokens(**SOURCE)
    whole = take(source.train_batches(0, 1, 6, seed=7), 3)
    halves = [take(source.train_batches(r, 2, 3, seed=7), 3) for r in range(2)]
    for k, ((tokens,), labels) in enumerate(whole):
        assert torch.equal(tokens, torch.cat([halves[0][k][0][0], halves[1][k][0][0]]))
        assert torch.equal(labels, torch.cat([halves[0][k][1], halves[1][k][1]]))


def test_start_skips_global_micro_batches():
    source = MarkovTokens(**SOURCE)
    skipped = take(source.train_batches(1, 2, 4, seed=7), 5)[3:]
    resumed = take(source.train_batches(1, 2, 4, seed=7, start=3), 2)
    for ((a,), la), ((b,), lb) in zip(skipped, resumed):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_seeds_and_eval_stream():
    source = MarkovTokens(**SOURCE)
    (train,), _ = next(source.train_batches(0, 1, 8, seed=SOURCE["seed"]))
    (other,), _ = next(source.train_batches(0, 1, 8, seed=SOURCE["seed"] + 1))
    (held,), _ = next(source.eval_batches(0, 1, 8, count=1))
    (again,), _ = next(source.eval_batches(0, 1, 8, count=1))
    assert not torch.equal(train, held) and not torch.equal(train, other) and torch.equal(held, again)
    assert len(list(source.eval_batches(0, 2, 8, count=3))) == 3
    assert not torch.equal(source.table, MarkovTokens(**{**SOURCE, "seed": 4}).table)


def test_named_layers_chain_is_forward_and_causal():
    torch.manual_seed(0)
    model = GPT(**MODEL, tie_head=True).eval()
    names = [name for name, _ in model.named_layers()]
    assert names == ["embedding", "block.0", "block.1", "head"]
    tokens = torch.randint(16, (3, 31))
    x = tokens
    for _, layer in model.named_layers():
        x = layer(x)
    logits = model(tokens)
    assert logits.shape == (3, 31, 16) and torch.equal(x, logits)
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 16
    assert torch.allclose(model(changed)[:, :20], logits[:, :20], atol=1e-6)  # no position sees the future
    assert not torch.allclose(model(changed)[:, 20:], logits[:, 20:])


@pytest.mark.parametrize("tie_head", [True, False])
def test_param_count_is_exact(tie_head):
    model = GPT(**MODEL, tie_head=tie_head)
    sizes = {k: v for k, v in MODEL.items() if k != "dropout"}
    assert param_count(**sizes, tie_head=tie_head) == sum(p.numel() for p in model.parameters())


def test_tied_head_is_the_token_embedding():
    tied, untied = GPT(**MODEL, tie_head=True), GPT(**MODEL, tie_head=False)
    assert tied.head.proj.weight is tied.embedding.token.weight
    assert untied.head.proj.weight is not untied.embedding.token.weight
    assert param_count(16, 32, 2, 32, 4, 4, False) - param_count(16, 32, 2, 32, 4, 4, True) == 16 * 32


def test_loss_is_fp32_and_uniform_logits_give_ln_v():
    labels = torch.randint(16, (2, 5))
    loss = NextTokenLoss()(torch.zeros(2, 5, 16, dtype=torch.bfloat16), labels)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(math.log(16))
    logits = GPT(**MODEL, tie_head=True).to(torch.bfloat16)(torch.randint(16, (2, 5)))
    assert logits.dtype == torch.bfloat16
