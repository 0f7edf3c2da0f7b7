"""Probe this host (side effects: environment, processes): the facts the planner takes as input."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from launcher.plan.types import HostFacts


def probe_host() -> HostFacts:
    return HostFacts(
        hostname=platform.node() or "localhost",
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        accelerators=count_cuda_devices(),
        extensions_dir=str(extensions_dir()),
    )


def count_cuda_devices() -> int:
    """Visible CUDA devices. Without nvidia-smi on PATH there are none, and torch is not imported (fast dry runs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
            capture_output=True, text=True, timeout=120, check=True,
        )
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def extensions_dir() -> Path:
    """hetero-launch's own cache of DeepSpeed's JIT-built ops, one folder per (python, torch, deepspeed).

    Other venvs on the machine write ~/.cache/torch_extensions too and can force a rebuild; ours is separate.
    HL_CACHE_DIR moves it (default: $XDG_CACHE_HOME/hetero-launch or ~/.cache/hetero-launch).
    """
    root = os.environ.get("HL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hetero-launch"
    )
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    tag = f"{py}-torch{_version('torch')}-deepspeed{_version('deepspeed')}"
    return Path(root) / "torch_extensions" / tag


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"
