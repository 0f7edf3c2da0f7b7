"""The record a run starts with: resolved config, plan, engine config, rank table, each rank's env, versions."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher.plan import RunPlan
from launcher.rundir import RunDir


def write_run_files(run_dir: RunDir, cfg: DictConfig, plan: RunPlan) -> None:
    """Everything but rank_env.json, which is written once the real master port is known (write_rank_env)."""
    run_dir.config.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    run_dir.write_json(run_dir.plan, plan.to_dict())
    engine_config = plan.engine_config()
    if engine_config is not None:
        run_dir.write_json(run_dir.ds_config, engine_config)
    run_dir.write_json(run_dir.rank_table, plan.rank_table)
    run_dir.write_json(run_dir.versions, versions())
    run_dir.write_json(run_dir.launcher, {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})


def write_rank_env(run_dir: RunDir, envs: dict[int, dict[str, str]]) -> None:
    """rank_env.json: each global rank's variables exactly as it is started (the real MASTER_PORT, not 0)."""
    run_dir.write_json(run_dir.rank_env, {str(rank): env for rank, env in sorted(envs.items())})


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("hetero-launch", "torch", "deepspeed", "hydra-core", "omegaconf", "rich"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    out["git"] = _git_hash()
    return out


def _git_hash() -> str:
    here = Path(__file__).resolve().parent
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if res.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
        return res.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
