"""Rank 1 leaves cleanly (exit code 0) after the first all-reduce, while rank 0 goes on into a second one and loses
its peer: the launcher must name rank 1, the first to leave, not rank 0.

Rank 0 goes on once rank 1's process has ended (and the launcher has had time to see it), so the run does not depend
on how long rank 1's interpreter takes to end after it left the group."""

import os
import sys
import time

import torch
import torch.distributed as dist


def ended(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


dist.init_process_group("gloo")
pids = [None, None]
dist.all_gather_object(pids, os.getpid())
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    dist.destroy_process_group()  # (exiting with gloo's threads alive can end in std::terminate, not exit 0)
    sys.exit(0)
deadline = time.monotonic() + 60
while not ended(pids[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.5)  # the launcher polls every 0.05 s
dist.all_reduce(t)  # rank 1 is gone: gloo says "Connection closed by peer"
