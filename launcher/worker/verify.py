"""A smoke run's check that its last checkpoint brings back exactly the state it saved: fingerprint the state,
move it away, load the checkpoint, fingerprint again."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from launcher.parallel.rank import local_tensor
from launcher.rundir import CheckpointDir


def _flat(node: Any, prefix: str):
    """(dotted key, leaf) of nested dicts and lists (state dicts)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _flat(v, f"{prefix}.{k}")
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _flat(v, f"{prefix}.{i}")
    else:
        yield prefix, node


def fingerprint(trainer) -> dict[str, str]:
    """sha256 of every tensor and number a checkpoint must bring back: progress, the engine's model and optimizer
    state (a sharded DeepSpeed engine: its local parameter partitions and its ZeRO optimizer's state dict, fp32
    master weights and moments included), the tables and their optimizers' states."""
    try:
        engine = trainer.engine.state_dict()
    except RuntimeError:  # ZeRO-sharded or wrapped: no in-memory state dict of the whole
        params = {n: getattr(p, "ds_tensor", None) if getattr(p, "ds_tensor", None) is not None else p
                  for n, p in trainer.engine.module.named_parameters()}
        engine = {"module": params, "optimizer": trainer.engine.optimizer.state_dict()}
    state = {"step": trainer.step, "data_position": trainer.data_position, "engine": engine,
             "tables": trainer.tables.state_dict() if trainer.tables is not None else {},
             "host_modules": trainer.hosted.state_dict() if trainer.hosted is not None else {}}
    out = {}
    for k, v in _flat(state, "state"):
        if torch.is_tensor(v):
            v = local_tensor(v)  # a DTensor: this rank's shard
            out[k] = hashlib.sha256(v.detach().float().cpu().numpy().tobytes()).hexdigest()
        elif isinstance(v, (int, float, bool)):
            out[k] = repr(v)
    return out

def perturb(trainer) -> None:
    """Move the live state away from the checkpoint's, so that a load that restores nothing is seen."""
    with torch.no_grad():
        for p in trainer.engine.module.parameters():
            t = getattr(p, "ds_tensor", None)
            t = t if t is not None else p
            local_tensor(t).add_(1.0)
        if trainer.tables is not None:
            for _, weight, _ in trainer.tables.held().values():
                weight.add_(1.0)
        for p in trainer.hosted.params if trainer.hosted is not None else ():
            p.add_(1.0)
    trainer.step, trainer.data_position = trainer.step + 1000, trainer.data_position + 1000

def verify_checkpoint(trainer, ckpt: CheckpointDir) -> None:
    """Read a just-written checkpoint back and check that it restores exactly the state it saved (smoke runs):
    the live state is moved away first, so a load that restores nothing fails too."""
    before = fingerprint(trainer)
    perturb(trainer)
    trainer.load(ckpt)
    after = fingerprint(trainer)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if differ:
        raise RuntimeError(f"checkpoint {ckpt.path} read back differs from the state it saved: "
                           f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}")
