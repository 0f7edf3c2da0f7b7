"""Make sure DeepSpeed's JIT-built ops exist in our cache before the ranks need them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from launcher.plan import RunPlan
from launcher.rundir import RunDir


def missing_ops(plan: RunPlan) -> list[str]:
    """Ops in plan.ds_ops with no built library in the cache yet."""
    if not plan.ds_ops:
        return []
    root = Path(plan.ranks[0].env["TORCH_EXTENSIONS_DIR"])
    return [op for op in plan.ds_ops if not (root / op / f"{op}.so").exists()]


def build_ops(plan: RunPlan, run_dir: RunDir, console: Console) -> None:
    """Build the missing ops in one child process, showing what is built and where. Raises on failure."""
    missing = missing_ops(plan)
    if not missing:
        return
    env = {**os.environ, **{k: v for k, v in plan.ranks[0].env.items() if k in ("TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR")}}
    # torch's JIT build calls `ninja` from PATH: put the interpreter's bin dir (where pip installed ninja) first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    log = run_dir.ops_build_log
    where = env["TORCH_EXTENSIONS_DIR"]
    msg = (
        f"Building DeepSpeed op(s) {', '.join(missing)}: first run on this machine only, about a minute each; "
        f"cached in {where}"
    )
    console.print(f"[bold]{msg}[/bold]")
    t0 = time.monotonic()
    with open(log, "w") as out, console.status("compiling with ninja/g++ ...", spinner="dots"):
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.worker.build_ops", *missing], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"building DeepSpeed op(s) {', '.join(missing)} failed (log: {log}):\n{tail}")
    console.print(f"built {', '.join(missing)} in {time.monotonic() - t0:.0f} s")
