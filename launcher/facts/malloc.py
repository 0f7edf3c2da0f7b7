"""Probe this host for the allocators a rank could preload, and the launcher's own allocator settings.

What is searched, as torch's CPU launcher (torch.backends.xeon.run_cpu ``add_lib_preload``) searches it, plus the
multiarch folders where Debian and Ubuntu install libraries: the interpreter's environment (sys.prefix, CONDA_PREFIX,
VIRTUAL_ENV), ~/.local/lib, /usr/local/lib(64), /usr/lib(64) and /usr/lib/<multiarch>, /lib/<multiarch>. The plan
(launcher/plan/malloc.py) decides; nothing here sets anything."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from launcher.plan.malloc import GLIBC_VARIABLES

LIBRARIES = {"tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so.4", "libtcmalloc.so")}
"""The file names of each allocator the plan may preload, best first: gperftools' tcmalloc without its profiler
(Debian's libtcmalloc-minimal4), then the full one."""

def library_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The folders searched, in order, without repeats."""
    environ = os.environ if environ is None else environ
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    found = [Path(sys.prefix) / "lib",
             *(Path(environ[v]) / "lib" for v in ("CONDA_PREFIX", "VIRTUAL_ENV") if environ.get(v)),
             Path.home() / ".local" / "lib", Path("/usr/local/lib"), Path("/usr/local/lib64"),
             *((Path("/usr/lib") / arch, Path("/lib") / arch) if arch else ()), Path("/usr/lib"), Path("/usr/lib64")]
    return list(dict.fromkeys(found))


def find_allocators(dirs: list[Path] | None = None) -> tuple[tuple[str, str], ...]:
    """(name, path) of each allocator of LIBRARIES found in ``dirs`` (default: library_dirs()), its first file."""
    dirs = library_dirs() if dirs is None else dirs
    out = []
    for name, files in LIBRARIES.items():
        path = next((d / f for f in files for d in dirs if (d / f).is_file()), None)
        if path is not None:
            out.append((name, str(path)))
    return tuple(out)


def glibc_settings(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The glibc malloc variables set in ``environ`` (default: this process's)."""
    environ = os.environ if environ is None else environ
    return tuple(v for v in GLIBC_VARIABLES if v in environ)
