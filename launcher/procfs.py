"""One reader for the kernel's "Key:   value kB" files (/proc/meminfo, /proc/self/status): the host's total and
available memory, a process's peak resident set; and the host's transparent huge pages setting. Torch-free: the
launcher, the planner's probe and the ranks use it."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path


def kernel_field(path: str | Path, key: str) -> int:
    """The value of line ``key`` of a /proc file in bytes (the kernel's "kB" is KiB; a value without a unit is taken
    as bytes); 0 when the file or the line cannot be read."""
    with suppress(OSError, ValueError):
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == key:
                    value, *unit = rest.split()
                    return int(value) * (1024 if unit and unit[0].lower() == "kb" else 1)
    return 0


THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_mode(setting: str | Path = THP_SETTING) -> str:
    """The host's transparent huge pages setting: always, madvise or never ('' where the file is missing: the kernel
    has none)."""
    try:
        words = Path(setting).read_text().split()
    except OSError:
        return ""
    return next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), "")
