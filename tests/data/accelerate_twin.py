"""tests/data/accelerate_script.py's training through runtime.prepare(): the same model, data and optimizer; rank r
takes batches r, r + world, ... of the same DataLoader, as accelerate's sharded loader deals them."""

import json

import torch
from torch.utils.data import DataLoader, TensorDataset

from launcher import runtime

torch.manual_seed(0)
data = TensorDataset(torch.randint(0, 32, (32, 6)), torch.randn(32))
model = torch.nn.Sequential(torch.nn.EmbeddingBag(32, 8), torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
model, optimizer = runtime.prepare(model, optimizer)
batches = list(DataLoader(data, batch_size=4))[runtime.rank()::runtime.world_size()]
for step, (tokens, target) in enumerate(batches, 1):
    loss = torch.nn.functional.mse_loss(model(tokens).squeeze(1).float(), target.float())
    runtime.backward(loss)
    runtime.step()
    print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
