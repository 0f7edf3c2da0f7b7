"""A small decoder-only transformer (GPT-2 shape: pre-norm blocks, learned positions) and its next-token loss.

``named_layers()`` lists the top-level stages in order, embedding -> block.0 .. block.{n-1} -> head; ``forward`` is
exactly running them one after the other, so a pipeline split can cut the list anywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    """Token plus learned position embedding: (B, T) int64 token ids -> (B, T, width), T <= seq_len."""

    def __init__(self, vocab_size: int, seq_len: int, width: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(seq_len, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.dropout(self.token(tokens) + self.position(positions))


class Attention(nn.Module):
    """Causal multi-head self-attention: (B, T, width) -> (B, T, width)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} is not a multiple of heads={heads}.")
        self.heads, self.head_dim, self.dropout = heads, width // heads, dropout
        self.qkv = nn.Linear(width, 3 * width)  # rows by head: head 0's q, k, v, then head 1's, ... (Megatron's)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One projection makes q, k and v, its rows grouped by head, so that a column split of it (tensor parallel:
        qkv column-split, out row-split) leaves a rank whole heads; heads are counted from its output. One Linear,
        not three: under tp 2 on the CPU three cost 1.35x the step (bench/before_after.py's tp row)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, -1, 3, self.head_dim).transpose(1, 2).unbind(dim=3)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(width)
        self.attn = Attention(width, heads, dropout)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width), nn.Dropout(dropout)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x)))
        return x + self.mlp(self.mlp_norm(x))


class Head(nn.Module):
    """Final LayerNorm and projection to the vocabulary (no bias): (B, T, width) -> logits (B, T, vocab_size)."""

    def __init__(self, width: int, vocab_size: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class GPT(nn.Module):
    """Decoder-only transformer: (B, T) int64 token ids, T <= seq_len -> logits (B, T, vocab_size) in the
    parameters' dtype. With tie_head the head's projection is the token embedding (one parameter)."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        layers: int,
        width: int,
        heads: int,
        mlp_ratio: int,
        tie_head: bool,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, seq_len, width, dropout)
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio, dropout) for _ in range(layers))
        self.head = Head(width, vocab_size)
        self.apply(_init_weights)
        if tie_head:
            self.head.proj.weight = self.embedding.token.weight

    def named_layers(self) -> list[tuple[str, nn.Module]]:
        """The stages in forward order: ("embedding", ...), ("block.0", ...), ..., ("head", ...)."""
        blocks = [(f"block.{i}", block) for i, block in enumerate(self.blocks)]
        return [("embedding", self.embedding), *blocks, ("head", self.head)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = tokens
        for _, layer in self.named_layers():
            x = layer(x)
        return x


class NextTokenLoss(nn.Module):
    """Mean cross-entropy over every predicted position, in nats, computed in fp32 whatever the logits' dtype.

    logits (B, T, V) and int64 labels (B, T) -> a scalar.
    """

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights for linear and embedding layers, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
