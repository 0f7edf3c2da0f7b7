"""Wide&Deep: logits = wide(ids, dense) + deep(ids, dense), split into tables and body.

``tables`` holds the two embedding tables; ``table_rows`` maps a batch's ids to table rows; ``body`` is the rest
(MLP and the wide part's dense linear) and takes the looked-up rows. ``forward`` chains the three, so the model
also trains whole (tables inside the DeepSpeed engine, dense gradients): the baseline of the sparse path.
"""

from __future__ import annotations

import torch
from torch import nn


class WideDeepBody(nn.Module):
    def __init__(self, num_dense: int, num_sparse: int, embed_dim: int, hidden: list[int]) -> None:
        super().__init__()
        self.wide_dense = nn.Linear(num_dense, 1)
        widths = [num_dense + num_sparse * embed_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, *, deep_embedding: torch.Tensor,
                wide_embedding: torch.Tensor) -> torch.Tensor:
        deep_in = torch.cat([dense, deep_embedding.flatten(1)], dim=1)
        wide = wide_embedding.sum(dim=1) + self.wide_dense(dense)
        return (self.mlp(deep_in) + wide).squeeze(-1)


class WideDeep(nn.Module):
    def __init__(self, num_dense: int, num_sparse: int, rows_per_table: int, embed_dim: int, hidden: list[int],
                 field_sizes: list[int] | None = None):
        super().__init__()
        sizes = list(field_sizes) if field_sizes else [rows_per_table] * num_sparse
        rows = sum(sizes)
        self.tables = nn.ModuleDict({"deep_embedding": nn.Embedding(rows, embed_dim), "wide_embedding": nn.Embedding(rows, 1)})
        nn.init.normal_(self.tables["deep_embedding"].weight, std=0.01)
        nn.init.zeros_(self.tables["wide_embedding"].weight)  # FTRL's weights start at 0
        self.body = WideDeepBody(num_dense, num_sparse, embed_dim, hidden)
        # Field f's ids live in rows [offsets[f], offsets[f] + sizes[f]) of each table.
        self.offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0)

    def table_rows(self, dense: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = ids + self.offsets.to(ids.device)
        return {"deep_embedding": rows, "wide_embedding": rows}

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        looked_up = {name: self.tables[name](rows) for name, rows in self.table_rows(dense, ids).items()}
        return self.body(dense, ids, **looked_up)
