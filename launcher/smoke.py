"""``smoke=true``: the recipe at a size CI can afford, with its structure kept.

A smoke run is composed as the real run is, with more overrides in front of the user's: SMOKE_BASE (2 steps, 2 gloo
ranks on the CPU (with parallel.sharding: the ranks its strategies span, e.g. 8 for parallel=semi_auto), 2 held-out batches, a checkpoint at the end) and the recipe's own ``smoke_profile`` (tiny shapes),
so placement, engine choice, ZeRO stage and offload stay the recipe's and any key the user gives still wins. The
keys the profile changed are listed in ``smoke_changes`` and shown in the plan."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

SMOKE_BASE: dict[str, Any] = {
    "trainer.steps": 2, "trainer.epochs": 0, "trainer.log_every": 1, "trainer.checkpoint_every": 0,
    "eval.every": 0, "eval.batches": 2, "eval.max_batches": 2,
    "cluster.nproc_per_node": 2, "cluster.device": "cpu", "cluster.backend": "gloo",
}


def flatten(node: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested keys as dotted ones; lists are values."""
    for k, v in node.items():
        if isinstance(v, Mapping):
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def hydra_value(v: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in v.items()) + "}"
    text = str(v)
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def smoke_settings(cfg: DictConfig) -> dict[str, Any]:
    """Dotted key -> value of a smoke run of cfg's recipe: SMOKE_BASE, then the recipe's smoke_profile. fp16 needs
    a GPU: a smoke run on the CPU takes bf16, the other half-precision path (listed with the changes)."""
    fp16 = {"precision": "bf16"} if cfg.precision == "fp16" else {}
    base = dict(SMOKE_BASE)
    if cfg.parallel.sharding:  # the strategies' factors multiply to the world size: keep the ranks they need
        del base["cluster.nproc_per_node"]
    return {**base, **fp16, **dict(flatten(OmegaConf.to_container(cfg.smoke_profile, resolve=True)))}


def smoke_overrides(settings: Mapping[str, Any]) -> list[str]:
    return [f"{k}={hydra_value(v)}" for k, v in settings.items()]


def smoke_changes(before: DictConfig, after: DictConfig, keys: list[str]) -> list[str]:
    """'key: before -> after' for each key whose value the smoke settings changed."""
    out = []
    for k in keys:
        a = OmegaConf.select(before, k, default=None, throw_on_missing=False)
        b = OmegaConf.select(after, k, default=None, throw_on_missing=False)
        a, b = (OmegaConf.to_container(x) if OmegaConf.is_config(x) else x for x in (a, b))
        if a != b:
            out.append(f"{k}: {a} -> {b}")
    return out
