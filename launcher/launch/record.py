"""The record a run starts with (resolved config, plan and its text, engine config, rank table, each rank's env,
versions), and the space kept from its start for the records it ends with."""

from __future__ import annotations

import errno
import os
import platform
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher.parallel.choose import engine_config as engine_config_of
from launcher.plan import RunPlan
from launcher.report.plan_view import plan_text
from launcher.rundir import RunDir


def write_run_files(run_dir: RunDir, cfg: DictConfig, plan: RunPlan) -> None:
    """Everything but rank_env.json, which is written once the real master port is known (write_rank_env)."""
    run_dir.config.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    run_dir.write_json(run_dir.plan, plan.to_dict())
    run_dir.plan_text.write_text(plan_text(plan))
    engine_config = engine_config_of(plan)
    if engine_config is not None:
        run_dir.write_json(run_dir.ds_config, engine_config)
    run_dir.write_json(run_dir.rank_table, plan.rank_table)
    run_dir.write_json(run_dir.versions, versions())
    run_dir.write_json(run_dir.launcher, {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                                          "dry_run": bool(cfg.get("dry_run", False))})


def write_rank_env(run_dir: RunDir, envs: dict[int, dict[str, str]]) -> None:
    """rank_env.json: each global rank's variables exactly as it is started (the real MASTER_PORT, not 0)."""
    run_dir.write_json(run_dir.rank_env, {str(rank): env for rank, env in sorted(envs.items())})


RESERVED_BYTES = 1 << 20
"""Disk space taken when a run dir is made and given back for its last records (summary.json, junit.xml: a few KiB
to some hundred KiB with many ranks), so that a disk that fills up mid-run still takes them."""


def reserve_space(run_dir: RunDir, nbytes: int = RESERVED_BYTES) -> None:
    """Take ``nbytes`` of the run dir's file system now (``run_dir.reserved``, a file of allocated blocks) for the
    records the run ends with: a disk that fills up mid-run still takes them once ``release_space`` gives the blocks
    back. OSError (naming the file) when the file system has not that much free."""
    fd = os.open(run_dir.reserved, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # ENOSPC and the like: not that much free
                raise
            os.write(fd, bytes(nbytes))  # a file system without fallocate: real blocks all the same
    except OSError as e:
        os.close(fd)
        run_dir.reserved.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(run_dir.reserved)) from None  # fallocate's error names no file
    os.close(fd)


def release_space(run_dir: RunDir) -> int:
    """Give the reserved blocks back (before the last records are written); the file system's free bytes before that
    (-1 when unknown): under RESERVED_BYTES means the disk filled up during the run."""
    try:
        st = os.statvfs(run_dir.path)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = -1
    run_dir.reserved.unlink(missing_ok=True)
    return free


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


def checkpoint_target(folder: str) -> Path | None:
    """trainer.checkpoint_dir, made if missing and checked writable, as an absolute path (the run dir's checkpoints/
    will link there from any working directory); None when unset. ConfigError naming the key, before any run dir
    exists, when it cannot be written (a folder that refuses writes would otherwise fail the first checkpoint)."""
    if not folder:
        return None
    target = Path(folder).resolve()
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / f".hetero-launch-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        from launcher.errors import ConfigError

        raise ConfigError(f"trainer.checkpoint_dir={folder}: checkpoints cannot be written there ({e.strerror or e}"
                          f"{f': {e.filename}' if e.filename else ''}). Set it to a folder every host can write (a "
                          f"shared file system for a multi-host job), or leave it unset for the run dir's "
                          f"checkpoints/.") from None
    return target


def check_checkpoint_dir_free(folder: str, resume_from: str) -> None:
    """trainer.checkpoint_dir is a job's own folder: one that holds complete checkpoints already (another run's,
    another recipe's) is refused, since this run would write over them and a restart would resume from them; unless
    the run resumes from one of them (it goes on in its own folder). ConfigError naming the key. Reads only: a dry
    run, ``check`` and a sweep's plans refuse what the run would (launch/planning.py plan_run)."""
    from launcher.errors import ConfigError
    from launcher.rundir import complete_checkpoints_in

    target = Path(folder).resolve()
    steps = [step for _, step in complete_checkpoints_in(target)]
    if not steps or (resume_from and Path(resume_from).resolve().parent == target):
        return
    raise ConfigError(f"trainer.checkpoint_dir={folder} holds checkpoints already (step {', '.join(map(str, steps))}): "
                      f"this run would write over them. Give each run its own folder, or go on from the newest with "
                      f"trainer.resume_from={target / f'step{steps[-1]}'}.")


def link_checkpoint_dir(run_dir: RunDir, target: Path | None) -> None:
    """The run dir's checkpoints/ links to trainer.checkpoint_dir (``checkpoint_target``), so that every reader and
    writer of checkpoints (the worker, a restart, trainer.resume=<run>) finds them where they always are."""
    if target is not None:
        run_dir.checkpoints.symlink_to(target, target_is_directory=True)
