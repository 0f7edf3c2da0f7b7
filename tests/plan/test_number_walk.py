"""Every number of the schema is checked for meaning: each int and float key of the root config, and the model and
data keys of the built-in recipes, is given a negative, a zero, a huge value, a fraction where a whole number belongs
and a word, and either planned (only where the key documents that value: a sentinel such as 0 = "what the host
reports", or a value that means what it says) or refused with exit 2 naming the key; never a traceback."""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.launch.planning import plan_run
from launcher.recipes import RECIPES
from launcher.schema import HeteroConfig

NEGATIVE, ZERO, HUGE, FRACTION, WORD = "-7", "0", "1000000000000000", "0.5", "abc"

PLANS = {
    # key: the probe values it plans with, as documented in launcher/schema.py (anything else exits 2)
    "optimizer.lr": {HUGE, FRACTION},  # a huge rate is a rate (a diverged run then fails)
    "optimizer.momentum": {ZERO, FRACTION},  # in [0, 1)
    "optimizer.eps": {HUGE, FRACTION},
    "optimizer.weight_decay": {ZERO, HUGE, FRACTION},
    "trainer.steps": {HUGE},
    "trainer.epochs": {ZERO, HUGE, FRACTION},  # 0 = trainer.steps decides
    "trainer.log_every": {HUGE},  # the first and last steps are logged anyway
    "trainer.seed": {ZERO},
    "trainer.checkpoint_every": {ZERO, HUGE},  # 0 = at the end
    "trainer.grad_clip": {ZERO, HUGE, FRACTION},  # 0 = off
    "trainer.early_stop.patience": {ZERO},  # 0 = never stop early (others need a validation split: refused by name)
    "trainer.early_stop.min_delta": {ZERO},  # the default (others alone do nothing: refused by name)
    "eval.every": {ZERO, HUGE},  # 0 = only at the end
    "eval.batches": {ZERO, HUGE},  # 0 = no evaluation
    "eval.max_batches": {ZERO, HUGE},  # 0 = no cap
    "batch.grad_accum": {HUGE},
    "batch.micro_batches": {HUGE},  # grad_accum by the pipeline's name
    "zero.stage": {ZERO},
    "placement.host_device_mix": {ZERO},
    "placement.reserve": {ZERO, FRACTION},  # a share kept free, in [0, 1)
    "cluster.node_rank": {ZERO},
    "cluster.rdzv_timeout_s": {HUGE, FRACTION},
    "cluster.master_port": {ZERO},  # 0 = a free port
    "cluster.device_memory_gb": {ZERO, HUGE, FRACTION},  # 0 = what the host reports; a plan for a bigger machine
    "cluster.host_memory_gb": {ZERO, HUGE},  # 0.5 GB is too little for the plan: refused, naming the key
    "output.stderr_tail": {ZERO, HUGE},
    "launcher.watchdog_s": {ZERO, HUGE, FRACTION},  # 0 = no watchdog
    "launcher.max_restarts": {ZERO, HUGE},
    "debug.fail_rank": {ZERO},
    "debug.fail_step": {HUGE},
    "model.num_dense": {ZERO},  # wide_deep: no continuous features
    "model.dropout": {ZERO, FRACTION},
    "data.seed": {ZERO},
    "data.skew": {ZERO, HUGE, FRACTION},  # gpt: 0 = uniform candidates; a huge skew: all on the first
    "data.noise": {ZERO, HUGE, FRACTION},  # resnet: the noise's standard deviation
    "data.effect_scale": {ZERO, HUGE, FRACTION},  # 0 = no planted effect
    "data.effect_decay": {ZERO, HUGE, FRACTION},
    "data.interaction_scale": {ZERO, HUGE, FRACTION},
}
"""Probe values that plan. A huge size (rows, widths, sequence length, batch) is refused by the memory plan, whose
message names what does not fit rather than the key: MEMORY below."""
MEMORY = "of host memory per host"
ELASTIC = {"cluster.launch": "elastic", "cluster.rdzv_endpoint": "127.0.0.1:29400"}
CONTEXT = {"cluster.rdzv_timeout_s": ELASTIC, "optimizer.eps": {"optimizer.name": "adam", "optimizer.momentum": 0.0}}
"""Keys walked with the backend or optimizer that reads them (with another, every value is refused: it would change
nothing; quickstart's momentum optimizer takes no eps, adam no momentum)."""


def numeric_keys(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += numeric_keys(t, f"{prefix}{f.name}.")
        elif t in (int, float):
            out.append((f"{prefix}{f.name}", t))
    return out


def cases() -> list[tuple[str, str, type]]:
    """(recipe, key, type): the root keys with quickstart; each built-in recipe's model and default data keys."""
    out = [("quickstart", key, t) for key, t in numeric_keys(HeteroConfig)]
    for name, recipe in sorted(RECIPES.items()):
        out += [(name, key, t) for key, t in numeric_keys(recipe.model_config, "model.")]
        data = next(iter(recipe.data_configs.values()))
        out += [(name, key, t) for key, t in numeric_keys(data, "data.")]
    return out


@functools.cache
def base(recipe: str):
    return compose_config([f"recipe={recipe}"])


def outcome(recipe: str, key: str, value: str, host) -> str:
    """'' when the plan is made, else the refusal's text. The value is set on the composed config as Hydra's
    override would set it (OmegaConf's type check on assignment is the one compose runs; the CLI's message for it
    is checked with a real compose below), then the whole plan is made."""
    cfg = copy.deepcopy(base(recipe))
    for other, setting in CONTEXT.get(key, {}).items():
        OmegaConf.update(cfg, other, setting)
    try:
        OmegaConf.update(cfg, key, OmegaConf.create({"v": value}).v if value != WORD else value)
    except ValidationError:
        return f"type: {key}={value}"
    try:
        plan_run(cfg, host)
    except ConfigError as e:
        return " ".join(str(e).split())
    return ""


@pytest.mark.parametrize("recipe", sorted({r for r, _, _ in cases()}))
def test_every_number_is_planned_as_documented_or_refused_by_name(recipe, cpu_host, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    host = dataclasses.replace(cpu_host, host_memory=24 * 2**30)  # this machine's: a memory plan to check against
    wrong = []
    for r, key, kind in cases():
        if r != recipe:
            continue
        for value in (NEGATIVE, ZERO, HUGE, FRACTION, WORD):
            refused = outcome(recipe, key, value, host)
            if not refused and value not in PLANS.get(key, ()):
                wrong.append(f"{key}={value} ({kind.__name__}) planned silently")
            elif refused and value in PLANS.get(key, ()):
                wrong.append(f"{key}={value} is documented but refused: {refused}")
            elif refused and key not in refused and not (value == HUGE and MEMORY in refused):
                wrong.append(f"{key}={value}: key not named: {refused[:300]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("override", ["trainer.steps=abc", "trainer.steps=0.5", "placement.reserve=abc"])
def test_a_wrong_type_exits_2_naming_the_key(override, tmp_path, cli):
    """What OmegaConf's type check refuses reaches the user as the CLI's one paragraph, naming the key."""
    res = cli(["recipe=quickstart", override, "dry_run=true"], tmp_path)
    assert res.returncode == 2 and override.split("=")[0] in res.stdout + res.stderr, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
