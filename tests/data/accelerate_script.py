"""An accelerate script as it is written for a GPU cluster (no cpu=True): Accelerator(), prepare, backward, step.
Each rank prints what accelerate built, then one JSON line per step with its own micro-batch's loss.
tests/data/accelerate_twin.py is the same training through runtime.prepare()."""

import json

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator()
torch.manual_seed(0)
data = TensorDataset(torch.randint(0, 32, (32, 6)), torch.randn(32))
model = torch.nn.Sequential(torch.nn.EmbeddingBag(32, 8), torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
inner = getattr(optimizer.optimizer, "cpu_offload", None)  # DeepSpeed's ZeRO optimizer says where its states are
print(json.dumps({"distributed_type": str(accelerator.distributed_type), "num_processes": accelerator.num_processes,
                  "process_index": accelerator.process_index, "mixed_precision": accelerator.mixed_precision,
                  "engine": type(model).__name__, "optimizer": type(optimizer.optimizer).__name__,
                  "zero_stage": model.zero_optimization_stage() if hasattr(model, "zero_optimization_stage") else None,
                  "cpu_offload": inner}), flush=True)
for step, (tokens, target) in enumerate(loader, 1):
    loss = torch.nn.functional.mse_loss(model(tokens).squeeze(1).float(), target.float())
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
accelerator.wait_for_everyone()
accelerator.end_training()  # as accelerate's examples end: the process group destroyed, not left to the exit
