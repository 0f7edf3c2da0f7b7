"""Before planning and before any process starts: the user's inputs on disk, and the facts of the recipe's data.

A missing script or an unreadable data file is reported like a config error (exit 2). The data facts (sizes the
model needs, samples per epoch, reference numbers) come from the recipe's own ``data_facts`` hook and go into the
plan as an input, as HostFacts do; the composed config is never changed.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher.contract import DataFacts
from launcher.errors import ConfigError
from launcher.plan import LaunchPlan, checkpoint_layout
from launcher.rundir import CheckpointDir


def check_script(cfg: DictConfig) -> None:
    if not Path(cfg.script).is_file():
        raise ConfigError(
            f"script={cfg.script}: no such file (relative paths start at {Path.cwd()}). "
            f"Give the path of a Python script, e.g. script=path/to/train.py."
        )


def check_resume(plan: LaunchPlan) -> None:
    """trainer.resume_from must be a checkpoint dir a run wrote, saved from the same recipe, engine and layout."""
    if not plan.resume_from:
        return
    ckpt = CheckpointDir(plan.resume_from)
    key = f"trainer.resume_from={plan.resume_from}"
    if not ckpt.meta.is_file():
        raise ConfigError(f"{key}: not a checkpoint dir (no {ckpt.meta.name} in it). Give one of a run's "
                          f"log_output/<run>/checkpoints/step<N> folders, or leave trainer.resume_from empty.")
    try:
        saved = json.loads(ckpt.meta.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}: {ckpt.meta} cannot be read ({e}); the checkpoint is incomplete or damaged. "
                          f"Give another checkpoint dir.") from None
    if saved.get("step", 0) >= plan.steps:
        raise ConfigError(f"{key}: the checkpoint is at step {saved.get('step')} and trainer.steps={plan.steps}: "
                          f"nothing is left to train. Set trainer.steps above {saved.get('step')}.")
    now = checkpoint_layout(plan)
    diff = [f"{k} {saved.get(k)} (now {v})" for k, v in now.items() if saved.get(k) != v]
    if diff:
        raise ConfigError(f"{key}: saved with {', '.join(diff)}. Resume with the settings it was saved with.")


def gather_data_facts(cfg: DictConfig) -> DataFacts:
    """The recipe's facts of cfg.data (its hook may read the user's files and raise ConfigError)."""
    from launcher.recipes import RECIPES

    return RECIPES[cfg.recipe.name].data_facts(OmegaConf.to_object(cfg.data))
