"""P4's baseline: the quickstart network trained by a hand-written torch DDP loop (run under torchrun).

Same model, data, batch (micro 16 per rank), loss and optimizer as `hetero-launch recipe=quickstart`; prints the
median of the mean step times of 20-step windows after the first 20 steps as `window_step_ms=<x>` (the windows
hetero-launch's metrics.jsonl reports a rate for).
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher.recipes.quickstart.data import FixedRandom
from launcher.recipes.quickstart.model import Network

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234)
model = DDP(Network(32, 16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.1)
loss_fn = torch.nn.MSELoss()
batches = FixedRandom(64, 32, 16, 0).train_batches(rank, world, 16, 1234)
windows, t0 = [], time.perf_counter()
for step in range(1, steps + 1):
    (x,), y = next(batches)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    if step % 20 == 0:
        now = time.perf_counter()
        if step > 20:
            windows.append((now - t0) / 20)
        t0 = now
if rank == 0:
    print(f"window_step_ms={statistics.median(windows) * 1000:.4f}", flush=True)
dist.destroy_process_group()
