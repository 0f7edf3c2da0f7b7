"""C sources shipped in the package, built once per compiler into hetero-launch's cache and loaded with ctypes (the
host tables' kernels: launcher/tables/kernels.c). Torch-free: the launcher's host probe asks ``choice`` before any
rank starts, and a plan says what the ranks will run."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from launcher.procfs import huge_pages_mode

FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
         "-std=c99")
"""No -march=native (the cache may be shared by other machines) and no contraction into FMAs but the ones a source
asks for (the kernels round as torch's element-wise ops do); no errno from sqrtf and no FP traps assumed, so that
loops with square roots and compares vectorize (IEEE results unchanged: nothing is reassociated)."""

ENV = "HL_TABLE_KERNELS"
"""auto (default): the C kernels where they build, torch's ops elsewhere; torch: torch's ops on purpose."""
PAGES_ENV = "HL_TABLE_HUGEPAGES"
"""1 (default): host tables and their optimizer states on transparent huge pages where the OS allows, born there or
moved there in the background (launcher/tables/hugepages.py); 0: left on the pages they have."""


def cache_root() -> Path:
    """hetero-launch's cache: $HL_CACHE_DIR, default $XDG_CACHE_HOME/hetero-launch or ~/.cache/hetero-launch (the
    DeepSpeed ops' torch_extensions/ and these libraries' native/)."""
    return Path(os.environ.get("HL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hetero-launch"))


def cache_dir() -> Path:
    """Where the built libraries are: cache_root()/native."""
    return cache_root() / "native"


SETTINGS = {ENV: ("auto", "torch"), PAGES_ENV: ("0", "1"), "HL_MEMORY_TRACKER": ("0", "1")}
"""The environment variables that choose how the ranks run, and the values each takes."""


def environment_problems() -> list[str]:
    """Before launch: each of SETTINGS set to a value it does not take (it was read as the default, silently), and
    a cache folder (HL_CACHE_DIR) that cannot be made or written (the ranks failed building their ops in it, or the
    host tables quietly took torch's ops while the plan said C kernels)."""
    problems = [f"{name}={os.environ[name]}: not one of {', '.join(values)}. Set one of them, or unset {name}."
                for name, values in SETTINGS.items() if os.environ.get(name, values[0]) not in values]
    root = cache_root()
    unwritable = _unwritable(root)
    if unwritable:
        where = f"HL_CACHE_DIR={root}" if os.environ.get("HL_CACHE_DIR") else f"the cache folder {root}"
        problems.append(f"{where}: hetero-launch cannot make or write it ({unwritable}); the ranks build and keep "
                        f"their native ops and kernels there. Set HL_CACHE_DIR to a folder you can write.")
    return problems


@functools.lru_cache(maxsize=4)
def _unwritable(folder: Path) -> str:
    """Why ``folder`` cannot be made or written ('' when it can): made and written once per folder and process (a
    sweep plans every job, an elastic launcher every round)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=folder, prefix=".hl-write-").close()
    except OSError as e:
        return str(e.strerror or e)
    return ""


def compiler() -> str | None:
    """$CC, else cc, gcc or clang on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def kernels_compiler() -> str | None:
    """The compiler the ranks' host-table kernels build with; None where they run torch's ops ($HL_TABLE_KERNELS=torch,
    or no compiler)."""
    return None if os.environ.get(ENV, "auto") == "torch" else compiler()


def choice() -> str:
    """What the ranks' host tables will run, in words: 'C kernels (<compiler>)' or 'torch ops (<why>)'."""
    cc = kernels_compiler()
    if cc:
        return f"C kernels ({os.path.basename(cc)})"
    if os.environ.get(ENV, "auto") == "torch":
        return f"torch ops ({ENV}=torch)"
    return "torch ops (no C compiler: cc, gcc or clang, on PATH)"


FBGEMM_DISTRIBUTIONS = ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-nightly-cpu", "fbgemm-gpu-nightly")
"""The packages that install fbgemm_gpu (its version is read from the first found; nothing is imported)."""


def fbgemm_choice() -> str:
    """Where fbgemm_gpu is installed, why the host tables whose optimizer FBGEMM also has (SGD, Adagrad, row-wise
    Adagrad) do not run on its kernels, in words; '' where it is not. Measured by bench/fbgemm_ops_bench.py: FBGEMM's
    CPU backward-and-update op on the store's own tables, table by table (its module's one call needs the tables in
    its own flat buffer, which a model's own modules are not), against the store's step."""
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return ""
    version = ""
    for name in FBGEMM_DISTRIBUTIONS:
        try:
            version = " " + importlib.metadata.version(name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    measured = ("its CPU update run on the store's tables took 1.1-5.8x the C kernels' step time at 26 x 1 M x 16 and "
                "8 x 4 M x 64 (docs/performance.md, bench/fbgemm_ops_bench.py)")
    if kernels_compiler():
        return f"fbgemm_gpu{version} installed, not used: {measured}"
    return f"fbgemm_gpu{version} installed, not used: the store keeps one update path ({measured}; not measured " \
           f"against torch's ops)"


def pages_wanted() -> bool:
    """Whether host tables move onto transparent huge pages here (launcher/tables/hugepages.py): not turned off
    (HL_TABLE_HUGEPAGES=0) and the host's setting is always or madvise."""
    return os.environ.get(PAGES_ENV, "1") != "0" and huge_pages_mode() in ("always", "madvise")


def pages_choice() -> str:
    """What the host tables' memory will be backed with, in words (each rank decides by pages_wanted on its own
    host)."""
    mode = huge_pages_mode()
    if pages_wanted():
        return f"tables moved onto transparent huge pages in the background (the host's setting: {mode})"
    if os.environ.get(PAGES_ENV, "1") == "0":
        return f"tables on 4 KiB pages ({PAGES_ENV}=0)"
    why = f"the host's setting is {mode}" if mode else "this kernel has none"
    return f"tables on 4 KiB pages (transparent huge pages: {why})"


def build(source: Path) -> Path:
    """The shared library of ``source`` for this compiler (built when missing; written under a temporary name and
    renamed: ranks that build at once each get a whole file). RuntimeError saying why it cannot be built."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(source.read_bytes() + version.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, str(source), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-400:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
