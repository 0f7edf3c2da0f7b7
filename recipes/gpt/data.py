"""Token sequences from a seeded order-2 Markov chain with a known entropy rate (see ``markov.py`` for the math).

The chain is a (V*V, K) table: row a*V + b lists the K distinct candidates that may follow the context (a, b), the
i-th drawn with probability profile[i]. The table comes from the source's own ``seed``; the samples from the trainer's
seed and the global micro-batch index only, so the stream does not depend on how it is split over ranks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset

from launcher.contract import dp_share, endless_shares
from launcher.recipes.gpt.markov import profile, uniform_loss

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]


class MarkovTokens:
    """Sequences of seq_len tokens over vocab_size from an order-2 chain with ``candidates`` successors per context,
    weighted by ``markov.profile(candidates, skew)``; ``seed`` fixes the chain (the trainer's seed, the samples)."""

    def __init__(self, vocab_size: int, seq_len: int, candidates: int, skew: float, seed: int) -> None:
        if not 1 <= candidates <= vocab_size:
            raise ValueError(f"candidates={candidates} must lie in [1, vocab_size={vocab_size}].")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.probs = torch.tensor(profile(candidates, skew), dtype=torch.float64)
        """(K,) probability of each candidate slot."""
        g = torch.Generator().manual_seed(seed)
        uniform = torch.ones(vocab_size * vocab_size, vocab_size)
        self.table = torch.multinomial(uniform, candidates, replacement=False, generator=g)
        """(V*V, K) int64: table[a*V + b, i] is the token that follows (a, b) with probability probs[i]."""
        contexts = torch.arange(vocab_size * vocab_size)[:, None]
        self._next = ((contexts % vocab_size * vocab_size + self.table) * candidates).view(-1)
        """(V*V*K,) int64: _next[c*K + i] = K * (the context after c when candidate i is drawn)."""

    def sequences(self, rows: int, generator: torch.Generator) -> torch.Tensor:
        """(rows, seq_len) int64 sequences: x_0, x_1 uniform, the rest from the chain; vectorised over rows.

        The walk runs on contexts c = a*V + b, kept as c*K so one lookup in ``_next`` gives the next one.
        """
        v, s, k = self.vocab_size, self.seq_len, self.table.shape[1]
        context = torch.randint(v * v, (rows,), generator=generator) * k
        slots = torch.multinomial(self.probs, (s - 2) * rows, replacement=True, generator=generator).view(s - 2, rows)
        contexts = [context]
        for slot in slots:
            contexts.append(self._next.index_select(0, contexts[-1] + slot))
        c = torch.stack(contexts, dim=1) // k  # (rows, S-1): context (x_t, x_{t+1}) at column t
        return torch.cat([c[:, :1] // v, c % v], dim=1)

    def true_nll(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-prediction cross-entropy of the true chain, in nats: (B, S-1) float64 for inputs and labels (B, S-1).

        Column 0 (x_1 from x_0 alone) is ln V; the others are -ln P(x_t | x_{t-2}, x_{t-1}), inf if impossible.
        """
        nll = torch.full(labels.shape, uniform_loss(self.vocab_size), dtype=torch.float64)
        rows = self.table[tokens[:, :-1] * self.vocab_size + tokens[:, 1:]]  # (B, S-2, K) candidates of each context
        hit = rows == labels[:, 1:, None]
        p = (hit.double() * self.probs).sum(-1)
        nll[:, 1:] = torch.where(p > 0, -p.log(), torch.full_like(p, math.inf))
        return nll

    def global_micro_batch(self, stream: str, seed: int, index: int, rows: int) -> Batch:
        """Global micro-batch ``index`` of ``stream`` ("train" or "eval"): ``rows`` sequences as ((tokens,), labels).

        Its generator is seeded by a 32-bit hash of (stream, seed, index) alone: torch's CPU generator keeps only the
        low 32 bits of a seed, so the three are hashed rather than packed into one integer.
        """
        digest = hashlib.blake2b(f"{stream}:{seed}:{index}".encode(), digest_size=4).digest()
        seqs = self.sequences(rows, torch.Generator().manual_seed(int.from_bytes(digest, "little")))
        return (seqs[:, :-1],), seqs[:, 1:]

    def train_batches(self, dp_rank: int, dp_size: int, micro_size: int, seed: int, start: int = 0) -> Iterator[Batch]:
        """Endless micro-batches of rank dp_rank: rows [dp_rank*micro_size, +micro_size) of global micro-batches
        start, start+1, ... Each item is ((tokens,), labels), both int64 (micro_size, seq_len-1)."""
        return endless_shares(lambda i, rows: self.global_micro_batch("train", seed, i, rows), dp_rank, dp_size,
                              micro_size, start)

    def eval_batches(self, dp_rank: int, dp_size: int, micro_size: int, count: int) -> Iterator[Batch]:
        """``count`` held-out micro-batches of rank dp_rank, from a stream seeded by the source's own seed."""
        for k in range(count):
            yield dp_share(self.global_micro_batch("eval", self.seed, k, micro_size * dp_size), dp_rank, micro_size)


class MarkovTokenDataset(Dataset):
    """The same chain as a map-style Dataset of ``samples`` sequences, for a recipe of yours that names a model and
    no data code (e.g. a HuggingFace causal LM): item i is ``{"input_ids": seq, "labels": seq}`` (HuggingFace's
    convention: the loss shifts, ``launcher.losses.TokenCrossEntropy(shift=true)``), or ``(seq[:-1], seq[1:])``
    with ``as_dict=false``. ``split_seed`` picks the sequences (another one for held-out data)."""

    def __init__(self, vocab_size: int, seq_len: int, samples: int, candidates: int = 4, skew: float = 1.0,
                 seed: int = 0, split_seed: int = 0, as_dict: bool = True) -> None:
        chain = MarkovTokens(vocab_size, seq_len, candidates, skew, seed)
        self.tokens = chain.sequences(samples, torch.Generator().manual_seed(split_seed))
        self.as_dict = as_dict

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        seq = self.tokens[i]
        return {"input_ids": seq, "labels": seq} if self.as_dict else (seq[:-1], seq[1:])
