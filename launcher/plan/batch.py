"""Solve global = micro x grad_accum x dp from any two of the three batch numbers."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MICRO_SIZE = 8
"""Samples per rank when a recipe sets neither batch.global_size nor batch.micro_size: HuggingFace Trainer's
per_device_train_batch_size default."""


@dataclass(frozen=True)
class BatchPlan:
    global_size: int
    """Samples per optimizer step over all data-parallel ranks."""
    micro_size: int
    """Samples per forward/backward on one rank."""
    grad_accum: int
    """Micro-batches accumulated per optimizer step."""


def plan_batch(global_size: int, micro_size: int, grad_accum: int, dp: int, accum_key: str = "batch.grad_accum"
               ) -> tuple[BatchPlan | None, list[str]]:
    """Infer the -1 entries. Returns (plan, []) or (None, problems). ``accum_key``: the key that gave grad_accum, which
    the problems name (a pipeline's batch.micro_batches sets it: its grad_accum=-1 would infer nothing)."""
    given = {k: v for k, v in (("global_size", global_size), ("micro_size", micro_size), ("grad_accum", grad_accum))}
    bad = [f"batch.{k}={v} must be a positive integer, or -1 to infer it." for k, v in given.items() if v == 0 or v < -1]
    if bad:
        return None, bad
    g, m, a = global_size, micro_size, grad_accum
    if g == -1 and m == -1:
        m = DEFAULT_MICRO_SIZE  # the plan says so (plan_launch's note)
    if a == -1 and (g == -1 or m == -1):
        a = 1  # only one size given: no accumulation
    if g == -1:
        g = m * a * dp
    elif m == -1:
        if g % (a * dp):
            return None, [_split_error(g, a, dp, "micro", accum_key)]
        m = g // (a * dp)
    elif a == -1:
        if g % (m * dp):
            return None, [_split_error(g, m, dp, "accum", accum_key)]
        a = g // (m * dp)
    if g != m * a * dp:
        inferable = ("one of batch.micro_size / batch.grad_accum" if accum_key == "batch.grad_accum" else
                     "batch.micro_size")
        return None, [
            f"batch does not divide: global {g} != micro {m} × accum {a} × dp {dp} (= {m * a * dp}). "
            f"Set batch.global_size={m * a * dp}, or set {inferable} to -1 to infer it."
        ]
    return BatchPlan(global_size=g, micro_size=m, grad_accum=a), []


def _split_error(g: int, other: int, dp: int, missing: str, accum_key: str) -> str:
    known = "accum" if missing == "micro" else "micro"
    lower = (g // (other * dp)) * other * dp
    fix = f"batch.global_size={lower}" if lower else f"batch.global_size={other * dp}"
    change = accum_key if known == "accum" else "batch.micro_size"
    return (f"batch does not divide: global {g} != {missing} ? × {known} {other} × dp {dp}; {g} is not a multiple of "
            f"{other * dp}. Set {fix}, or change {change}.")
