"""The run dir is the record of a run: resolved config, plan, DeepSpeed JSON, rank table, env, versions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher.errors import ConfigError
from launcher.plan import LaunchPlan
from launcher.plan.script import ScriptPlan


def create_run_dir(log_dir: Path, run_name: str, recipe: str) -> Path:
    """Make a new run dir; never reuse one. An explicit run_name that exists is an error."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if run_name:
        path = log_dir / run_name
        try:
            path.mkdir()
        except FileExistsError:
            raise ConfigError(
                f"output.run_name={run_name}: {path} already exists and runs are never overwritten. "
                f"Pick another output.run_name, or leave it empty for <recipe>-<timestamp>."
            ) from None
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = log_dir / (f"{recipe}-{stamp}" + (f"-{n}" if n else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a new run dir under {log_dir}")


def write_run_files(run_dir: Path, cfg: DictConfig, plan: LaunchPlan | ScriptPlan) -> None:
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    _write_json(run_dir / "plan.json", plan.to_dict())
    if plan.deepspeed:
        _write_json(run_dir / "ds_config.json", plan.deepspeed)
    _write_json(run_dir / "rank_table.json", plan.rank_table)
    _write_json(run_dir / "rank_env.json", {str(r.rank): r.env for r in plan.ranks})
    _write_json(run_dir / "versions.json", versions())


def point_latest(log_dir: Path, run_dir: Path) -> None:
    """log_dir/latest -> run_dir (relative symlink, replaced atomically)."""
    tmp = log_dir / f".latest.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, log_dir / "latest")


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


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
