"""Checks of the user's inputs on disk (script, data files), before planning and before any process starts."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from launcher.errors import ConfigError


def check_inputs(cfg: DictConfig) -> None:
    """Raise ConfigError naming each missing or unreadable input and how to fix it."""
    problems = []
    if cfg.script:
        path = Path(cfg.script)
        if not path.is_file():
            problems.append(
                f"script={cfg.script}: no such file (relative paths start at {Path.cwd()}). "
                f"Give the path of a Python script, e.g. script=path/to/train.py."
            )
    if problems:
        raise ConfigError(problems)
