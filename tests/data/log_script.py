"""A torch.distributed script that prints a line on each rank and records two steps with runtime.log (without
runtime.prepare()): rank r's loss at step s is 1/s + r, so the average over 2 ranks at step 2 is 1.0."""

import sys

import torch.distributed as dist

from launcher import runtime

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
print(f"warning on rank {rank}", file=sys.stderr, flush=True)
for step in (1, 2):
    runtime.log(step=step, loss=1.0 / step + rank, acc=0.25 * step)
dist.destroy_process_group()
