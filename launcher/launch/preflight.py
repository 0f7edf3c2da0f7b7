"""Before planning and before any process starts: the user's inputs on disk, and the facts of the recipe's data.

A missing script or an unreadable data file is reported like a config error (exit 2). The data facts (sizes the
model needs, samples per epoch, reference numbers) come from the recipe's own ``data_facts`` hook and go into the
plan as an input, as HostFacts do; the composed config is never changed.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher.contract import DataFacts
from launcher.errors import ConfigError
from launcher.rundir import CheckpointDir


def check_script(cfg: DictConfig) -> None:
    if not Path(cfg.script).is_file():
        raise ConfigError(
            f"script={cfg.script}: no such file (relative paths start at {Path.cwd()}). "
            f"Give the path of a Python script, e.g. script=path/to/train.py."
        )


def check_resume(cfg: DictConfig) -> None:
    """trainer.resume_from must be a checkpoint dir a run wrote (it has rank 0's trainer state)."""
    path = cfg.trainer.resume_from
    if path and not CheckpointDir(path).trainer(0).is_file():
        raise ConfigError(
            f"trainer.resume_from={path}: not a checkpoint dir (no {CheckpointDir(path).trainer(0).name} in it). "
            f"Give one of a run's log_output/<run>/checkpoints/step<N> folders, or leave it empty."
        )


def gather_data_facts(cfg: DictConfig) -> DataFacts:
    """The recipe's facts of cfg.data (its hook may read the user's files and raise ConfigError)."""
    from launcher.recipes import RECIPES

    return RECIPES[cfg.recipe.name].data_facts(OmegaConf.to_object(cfg.data))
