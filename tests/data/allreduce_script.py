"""A plain torch.distributed script written for torchrun: all-reduce each rank's id and check the sum."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// rendezvous, as under torchrun
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
assert int(os.environ["LOCAL_RANK"]) == rank % int(os.environ["LOCAL_WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} sum={t.item()} expected={expected} args={sys.argv[1:]}", flush=True)
if "--fail-on-rank" in sys.argv and rank == int(sys.argv[sys.argv.index("--fail-on-rank") + 1]):
    # Leave the group first: exiting with gloo's threads alive can end in std::terminate (SIGABRT), not exit 3.
    dist.destroy_process_group()
    raise SystemExit(3)
assert t.item() == expected
dist.destroy_process_group()
