"""Wide&Deep: logits = wide(ids, dense) + deep(ids, dense)."""

from __future__ import annotations

import torch
from torch import nn


class WideDeep(nn.Module):
    def __init__(self, num_dense: int, num_sparse: int, rows_per_table: int, embed_dim: int, hidden: list[int]):
        super().__init__()
        rows = num_sparse * rows_per_table
        self.deep_embedding = nn.Embedding(rows, embed_dim)
        self.wide_embedding = nn.Embedding(rows, 1)
        nn.init.normal_(self.deep_embedding.weight, std=0.01)
        nn.init.zeros_(self.wide_embedding.weight)
        self.wide_dense = nn.Linear(num_dense, 1)
        widths = [num_dense + num_sparse * embed_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], 1))
        self.mlp = nn.Sequential(*layers)
        # Field f's ids live in rows [f * rows_per_table, (f + 1) * rows_per_table) of each table.
        self.register_buffer("offsets", torch.arange(num_sparse) * rows_per_table, persistent=False)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        rows = ids + self.offsets
        deep_in = torch.cat([dense, self.deep_embedding(rows).flatten(1)], dim=1)
        wide = self.wide_embedding(rows).sum(dim=1) + self.wide_dense(dense)
        return (self.mlp(deep_in) + wide).squeeze(-1)
