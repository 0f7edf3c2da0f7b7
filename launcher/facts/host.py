"""Probe this host (side effects: environment, processes): the facts the planner takes as input."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from launcher import native
from launcher.facts import malloc
from launcher.plan.types import HostFacts
from launcher.procfs import kernel_field


def probe_host() -> HostFacts:
    toolchain = probe_toolchain()
    accelerators, device_memory, note = cuda_devices()
    return HostFacts(
        hostname=platform.node() or "localhost",
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        accelerators=accelerators,
        extensions_dir=str(extensions_dir(toolchain)),
        toolchain_path=toolchain.path,
        notes=(note,) if note else (),
        host_memory=host_memory(),
        device_memory=device_memory,
        table_kernels=f"{native.choice()}; {native.pages_choice()}",
        table_fbgemm=native.fbgemm_choice(),
        omp_threads=os.environ.get("OMP_NUM_THREADS", ""),
        malloc_libs=malloc.find_allocators(),
        preload=os.environ.get("LD_PRELOAD", ""),
        malloc_vars=malloc.glibc_settings(),
    )


PROBE_TIMEOUT_S = 120
"""How long torch may take to count the CUDA devices (a first CUDA init on a busy host takes seconds)."""


def cuda_devices(environ: Mapping[str, str] | None = None, dev: Path = Path("/dev"),
                 probe=None) -> tuple[int, int, str]:
    """(visible CUDA devices, bytes of memory of the smallest of them, a note when they could not be counted).
    torch counts them and reads each one's memory, in a child process, when the host shows NVIDIA's driver
    (nvidia-smi on PATH, or /dev/nvidia<N> device files: a container may have the devices without the tool); a host
    with neither has none, and torch is not imported (fast dry runs). A probe that fails or times out on such a host
    is said, not taken silently for a CPU host. ``probe``: a stand-in for the child, giving the count or (count,
    bytes of each device)."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0, 0, ""
    devices = sorted(str(p) for p in dev.glob("nvidia[0-9]*"))
    if shutil.which("nvidia-smi", path=environ.get("PATH")) is None and not devices:
        return 0, 0, ""
    try:
        found = (probe or _torch_devices)()
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
        seen = f"NVIDIA device files ({', '.join(devices)})" if devices else "nvidia-smi"
        return 0, 0, (f"this host shows {seen}, but torch could not count its CUDA devices ({_reason(e)}): planning "
                      f"a CPU run. Check `python -c 'import torch; print(torch.cuda.device_count())'`; set "
                      f"cluster.device=cuda to refuse a CPU run.")
    count, sizes = found if isinstance(found, tuple) else (found, ())
    return count, min(sizes, default=0) if count else 0, ""


_DEVICES = """import torch
n = torch.cuda.device_count()
try:
    sizes = [torch.cuda.get_device_properties(i).total_memory for i in range(n)]
except Exception:
    sizes = []
print(n, *sizes)"""
"""The child's program: the count of visible devices, then the bytes of each when CUDA can read them (no context is
made on a device; a count without sizes is what the count alone was before)."""


def _torch_devices() -> tuple[int, tuple[int, ...]]:
    out = subprocess.run([sys.executable, "-c", _DEVICES], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                         check=True)
    count, *sizes = (int(v) for v in out.stdout.strip().splitlines()[-1].split())
    return count, tuple(sizes)


MEMINFO = Path("/proc/meminfo")
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""A container's memory limit: cgroup v2's, then v1's."""
NO_LIMIT = 1 << 60
"""A limit this high is none (cgroup v1 writes 'unlimited' as 2^63 rounded down to a page)."""


def host_memory(meminfo: Path = MEMINFO, limits: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """Bytes of memory the run may use on this host: MemTotal of ``meminfo``, or a cgroup's limit (``limits``) when
    lower ("max": none); 0 when none of them can be read."""
    sizes = [kernel_field(meminfo, "MemTotal"), *(_cgroup_limit(p) for p in limits)]
    return min((s for s in sizes if 0 < s < NO_LIMIT), default=0)


def _cgroup_limit(path: Path) -> int:
    """A cgroup's memory limit in bytes; 0 for none ("max") or an unreadable file."""
    try:
        text = path.read_text().strip()
        return 0 if text == "max" else int(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return 0


def _reason(e: BaseException) -> str:
    if isinstance(e, subprocess.TimeoutExpired):
        return f"no answer within {PROBE_TIMEOUT_S} s"
    if isinstance(e, subprocess.CalledProcessError):
        tail = (e.stderr or "").strip().splitlines()
        return f"exit {e.returncode}: {tail[-1] if tail else 'no message'}"
    return f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class Toolchain:
    """What a JIT build of a DeepSpeed op depends on besides its sources. torch writes each of these into the op's
    build.ninja (absolute include paths, the compiler) or runs it (ninja); when one differs between two builds of
    one folder, ninja sees a changed command line and rebuilds everything (minutes), so they key the cache."""

    prefix: str
    """The interpreter's environment (sys.prefix): one venv's build never lands in another's folder."""
    torch_include: str
    """torch's headers, found without importing torch (fast dry runs)."""
    deepspeed_dir: str
    """DeepSpeed's package dir: the op sources compiled (csrc/)."""
    ninja: str
    """The ninja found on ``path`` and its version ('' when none): ninja 1.11 and 1.13 rebuild each other's output."""
    cxx: str
    """$CXX, else the c++ found on ``path`` (resolved: an upgraded compiler is a new key)."""
    path: str
    """PATH for the build and for the ranks: the interpreter's bin dir first (pip's ninja), then the launcher's."""


def toolchain_path(environ: Mapping[str, str] | None = None, executable: str | None = None) -> str:
    """The one PATH both the launcher's pre-build and the ranks run with. torch's JIT build calls ``ninja`` and
    ``c++`` from PATH, so a launcher started from a venv that is not activated would otherwise build with one ninja
    and start ranks that build again with another."""
    environ = os.environ if environ is None else environ
    first = str(Path(executable or sys.executable).parent)  # the venv's bin, not resolved (a venv's python links out)
    rest = [p for p in environ.get("PATH", "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


def probe_toolchain(environ: Mapping[str, str] | None = None) -> Toolchain:
    """This interpreter's build toolchain (``environ``: another's, for tests)."""
    environ = os.environ if environ is None else environ
    path = toolchain_path(environ)
    ninja = shutil.which("ninja", path=path) or ""
    cxx = environ.get("CXX") or shutil.which("c++", path=path) or ""
    torch_dir = _package_dir("torch")
    return Toolchain(
        prefix=os.path.realpath(sys.prefix),
        torch_include=os.path.join(torch_dir, "include") if torch_dir else "",
        deepspeed_dir=_package_dir("deepspeed"),
        ninja=f"{ninja} {_ninja_version(ninja)}" if ninja else "",
        cxx=os.path.realpath(cxx) if os.sep in cxx else cxx,
        path=path,
    )


def cache_key(toolchain: Toolchain) -> str:
    """The op cache folder's name: readable versions, then a digest of the paths and tools of ``toolchain`` (not
    its whole PATH: unrelated entries must not invalidate the cache). Stable across processes (sha256, not hash())."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    parts = (toolchain.prefix, toolchain.torch_include, toolchain.deepspeed_dir, toolchain.ninja, toolchain.cxx)
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]
    return f"{py}-torch{_version('torch')}-deepspeed{_version('deepspeed')}-{digest}"


def extensions_dir(toolchain: Toolchain | None = None) -> Path:
    """hetero-launch's own cache of DeepSpeed's JIT-built ops, one folder per ``cache_key``.

    Other venvs on the machine write ~/.cache/torch_extensions too and can force a rebuild; ours is separate.
    HL_CACHE_DIR moves it (default: $XDG_CACHE_HOME/hetero-launch or ~/.cache/hetero-launch)."""
    return native.cache_root() / "torch_extensions" / cache_key(toolchain or probe_toolchain())


def _package_dir(name: str) -> str:
    """Where an installed package lives, without importing it ('' when absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.realpath(locations[0]) if locations else ""


def _ninja_version(ninja: str) -> str:
    try:
        out = subprocess.run([ninja, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() or "?"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"
