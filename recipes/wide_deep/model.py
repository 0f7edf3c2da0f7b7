"""Wide&Deep: logits = wide(ids, dense) + deep(ids, dense), a plain nn.Module.

``deep_embedding`` and ``wide_embedding`` are ordinary ``nn.Embedding`` tables (one row range per field). With
sparse table optimizers the launcher swaps them for host (or device) lookups (``launcher/tables/lookup.py``), as
it does for any user's model; with ``tables.<name>.optimizer=dense`` the whole model trains inside the parts.

The forward runs its four layers in order over a state it hands from one to the next, and skips a layer that is
None: a pipeline stage keeps some of the layers and removes the others (torchtitan's manual split), so the model
can be cut after any layer and each stage runs this same forward on what the previous stage sent.
"""

from __future__ import annotations

import torch
from torch import nn

LAYERS = ("deep_embedding", "wide_embedding", "wide_dense", "mlp")


class WideDeep(nn.Module):
    def __init__(self, num_dense: int, num_sparse: int, rows_per_table: int, embed_dim: int, hidden: list[int],
                 field_sizes: list[int] | None = None):
        super().__init__()
        sizes = list(field_sizes) if field_sizes else [rows_per_table] * num_sparse
        rows = sum(sizes)
        self.deep_embedding = nn.Embedding(rows, embed_dim)
        self.wide_embedding = nn.Embedding(rows, 1)
        nn.init.normal_(self.deep_embedding.weight, std=0.01)
        nn.init.zeros_(self.wide_embedding.weight)  # FTRL's weights start at 0
        self.wide_dense = nn.Linear(num_dense, 1)
        widths = [num_dense + num_sparse * embed_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], 1))
        self.mlp = nn.Sequential(*layers)
        # Field f's ids live in rows [offsets[f], offsets[f] + sizes[f]) of each table.
        self.offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0)

    def forward(self, *state: torch.Tensor) -> torch.Tensor:
        """(dense, ids) -> logits; a pipeline stage gets the state the previous stage's last layer left."""
        for name in LAYERS:
            if getattr(self, name) is not None:
                state = getattr(self, f"_{name}")(*state)
        return state

    def _deep_embedding(self, dense: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = ids + self.offsets.to(ids.device)  # one tensor for both tables: their lookups share one exchange
        return dense, rows, torch.cat([dense, self.deep_embedding(rows).flatten(1)], dim=1)

    def _wide_embedding(self, dense: torch.Tensor, rows: torch.Tensor, deep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return dense, deep, self.wide_embedding(rows).sum(dim=1)

    def _wide_dense(self, dense: torch.Tensor, deep: torch.Tensor, wide: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return deep, wide + self.wide_dense(dense)

    def _mlp(self, deep: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
        return (self.mlp(deep) + wide).squeeze(-1)
