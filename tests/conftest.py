"""Shared fixtures: compose a recipe as the CLI does, a CPU-only host, and running the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import compose_config
from launcher.launch.host import extensions_dir
from launcher.plan import HostFacts, plan_launch
from launcher.recipes import RECIPES

ALL_RECIPES = sorted(RECIPES)


@pytest.fixture
def cpu_host() -> HostFacts:
    """This CI machine's shape: 2 cores, no accelerator; the real op cache (built once per machine)."""
    return HostFacts(hostname="ci", cpu_count=2, accelerators=0, extensions_dir=str(extensions_dir()))


def plan_of(overrides: list[str], host: HostFacts, config_dir: str | None = None):
    """Compose and plan as the CLI does (the recipe's facts gathered first)."""
    from launcher.launch.preflight import gather_facts

    cfg = compose_config(overrides, config_dir)
    return plan_launch(cfg, host, gather_facts(cfg, config_dir))


def init_one_process_group():
    """A real 1-process gloo group on a free port, for code that needs torch.distributed in the test process.
    DeepSpeed loads its shm op from our cache."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):  # DeepSpeed's engine reads them
        os.environ.setdefault(key, value)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def run_cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `hetero-launch args` (this interpreter) in cwd; wide terminal so messages are not wrapped."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_summary(cwd: Path) -> dict:
    return json.loads((cwd / "log_output" / "latest" / "summary.json").read_text())
