"""DeepSpeed's JIT-built C++ ops: built once, by the launcher, before the ranks need them; and a rank that compiles
one anyway (an op the launcher did not know of) is announced on the console instead of stalling in silence.

The cache (TORCH_EXTENSIONS_DIR) is one folder per venv and toolchain (``launch.host.cache_key``). The launcher
builds with the ranks' own PATH and accelerator settings (their planned env), so a rank's JIT load finds the op
built by the same ninja and compiler and has nothing to rebuild."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from launcher.plan import RunPlan
from launcher.rundir import RunDir

STAMP = "hetero-launch.json"
"""Written beside an op's library after the launcher built it: the cache key and the library's size and mtime."""

BUILD_ENV = ("TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR", "PATH", "CUDA_VISIBLE_DEVICES")
"""The ranks' planned variables a build depends on: where it lands, which accelerator's builder, which toolchain."""


def missing_ops(plan: RunPlan) -> list[str]:
    """Ops in plan.ds_ops not built for this cache key yet: no library, or one the launcher did not build for this
    key (no stamp, another key's stamp, or a library changed since: something else rebuilt it)."""
    if not plan.ds_ops:
        return []
    root = Path(plan.ranks[0].env["TORCH_EXTENSIONS_DIR"])
    return [op for op in plan.ds_ops if not is_built(root, op)]


def library(root: Path, op: str) -> Path:
    """Where torch's JIT build puts op's shared library in the cache ``root``."""
    return root / op / f"{op}.so"


def is_built(root: Path, op: str) -> bool:
    """``root/op/op.so`` exists and its stamp says the launcher built it for ``root``'s key, as it is now."""
    so = library(root, op)
    try:
        stamp = json.loads((root / op / STAMP).read_text())
        st = so.stat()
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("key") == root.name and stamp.get("size") == st.st_size
            and stamp.get("mtime_ns") == st.st_mtime_ns)


def write_stamp(root: Path, op: str, path: str) -> None:
    """Record that ``op`` was built (or found up to date) for ``root``'s key with ``path``'s toolchain."""
    st = library(root, op).stat()
    stamp = {"key": root.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "path": path,
             "python": sys.executable, "time": time.time()}
    (root / op / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")


def toolchain_env(plan: RunPlan) -> dict[str, str]:
    """The build's environment: the launcher's, with the ranks' planned values of BUILD_ENV on top."""
    planned = plan.ranks[0].env
    return {**os.environ, **{k: planned[k] for k in BUILD_ENV if k in planned}}


def build_ops(plan: RunPlan, run_dir: RunDir, console: Console) -> None:
    """Build the missing ops in one child process, showing what is built and where. Raises on failure."""
    missing = missing_ops(plan)
    if not missing:
        return
    env = toolchain_env(plan)
    root = Path(env["TORCH_EXTENSIONS_DIR"])
    log = run_dir.ops_build_log
    console.print(f"[bold]{escape(_build_line(root, missing))}[/bold]", soft_wrap=True)
    t0 = time.monotonic()
    with open(log, "w") as out, console.status("compiling with ninja/c++ ...", spinner="dots"):
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.worker.build_ops", *missing], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    built = [op for op in missing if library(root, op).exists()]
    if proc.returncode != 0 or len(built) != len(missing):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"building DeepSpeed op(s) {', '.join(missing)} failed (log: {log}):\n{tail}")
    for op in built:
        write_stamp(root, op, env.get("PATH", ""))
    console.print(f"DeepSpeed op(s) {', '.join(missing)} ready in {time.monotonic() - t0:.0f} s")


def _build_line(root: Path, missing: list[str]) -> str:
    """What the build is about to do: compile the ops with no library, re-check (a ninja no-op when the toolchain is
    the same) those built outside the launcher, e.g. by a rank or a launcher of before the stamps."""
    found = [op for op in missing if library(root, op).exists()]
    new = [op for op in missing if op not in found]
    parts = [f"Building DeepSpeed op(s) {', '.join(new)} (once per venv and toolchain, 1-3 min each)"] if new else []
    if found:
        parts.append(f"{'checking' if new else 'Checking'} {', '.join(found)} (built outside the launcher) with the "
                     f"ranks' toolchain")
    return "; ".join([*parts, f"cached in {root}"])


class RankBuildWatch:
    """Says on the console when a rank compiles a DeepSpeed op: one the launcher did not prebuild (a ``script=``'s
    op not listed in ``script_ops``, or a rank's toolchain that differs from the launcher's).

    torch's JIT build holds ``<TORCH_EXTENSIONS_DIR>/<op>/lock`` while ninja runs; a load with nothing to build
    holds it for well under a second. A lock older than ``min_age_s`` is a compile, announced once per op. The
    ranks themselves are not changed: this watches the cache the plan gave them (this host's ranks only)."""

    def __init__(self, plan: RunPlan, console: Console, every_s: float = 1.0, min_age_s: float = 3.0) -> None:
        env = plan.ranks[0].env if plan.ranks else {}
        self._root = Path(env["TORCH_EXTENSIONS_DIR"]) if "TORCH_EXTENSIONS_DIR" in env else None
        self._console, self._every_s, self._min_age_s = console, every_s, min_age_s
        self._next = 0.0
        self.announced: set[str] = set()

    def tick(self) -> None:
        """Called with the progress tick (every 50 ms); looks at the cache at most every ``every_s``."""
        now = time.monotonic()
        if self._root is None or now < self._next:
            return
        self._next = now + self._every_s
        for op in self.compiling(time.time()):
            self.announced.add(op)
            fix = escape(f"script_ops=[{op}]")
            self._console.print(
                f"[yellow]a rank is compiling DeepSpeed op {op} (in {escape(str(self._root / op))}): the launcher did "
                f"not prebuild it. The ranks wait for it (1-3 min, once per venv). For a script=, add it to "
                f"script_ops ({fix}) to build it before the ranks start.[/yellow]", soft_wrap=True)

    def compiling(self, wall_now: float) -> list[str]:
        """Ops whose build lock is older than min_age_s and not yet announced."""
        try:
            locks = list(self._root.glob("*/lock"))
        except OSError:
            return []
        out = []
        for lock in locks:
            try:
                age = wall_now - lock.stat().st_mtime
            except OSError:
                continue  # released meanwhile
            if age >= self._min_age_s and lock.parent.name not in self.announced:
                out.append(lock.parent.name)
        return sorted(out)
