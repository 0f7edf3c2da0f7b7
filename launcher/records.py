"""A run dir's JSON records as its readers take them: whatever a crash, a full disk or a bad copy left there (cut short,
a stray byte, another type) reads as None, is skipped and counted, or is a DamagedRecord that says what is wrong,
never a traceback. Torch-free and Hydra-free, as launcher/rundir.py."""

from __future__ import annotations

import json
import math
from contextlib import suppress
from pathlib import Path
from typing import Any

__all__ = ["DamagedRecord", "checked_json_lines", "finite", "is_step", "json_lines", "json_type", "load_record",
           "read_record"]


def read_record(path: Path) -> Any:
    """A JSON record's value; None when it cannot be read (absent, being rewritten, not UTF-8, not JSON)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None


class DamagedRecord(ValueError):
    """A run dir's record that does not read as what its reader takes; the message says what is wrong, ``path``
    which file."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(why)
        self.path = path


def load_record(path: Path, shape: type = dict) -> Any:
    """A JSON record's value, of type ``shape``; DamagedRecord when it cannot be read (a folder, no permission), is
    not UTF-8 (a stray byte), is empty or not JSON (cut short: its writer died, a disk filled up) or holds another
    type."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DamagedRecord(path, f"it cannot be read ({e.strerror or e})") from None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DamagedRecord(path, f"it is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    except (ValueError, RecursionError) as e:
        why = "it is empty" if not data.strip() else f"it is not JSON, or cut short ({e})"
        raise DamagedRecord(path, why) from None
    if not isinstance(value, shape):
        raise DamagedRecord(path, f"it holds a JSON {json_type(value)}, where a JSON {json_type(shape())} belongs")
    return value


def json_type(value: Any) -> str:
    """The JSON name of a value's type: object, array, string, number, boolean, null."""
    for kinds, name in ((dict, "object"), ((list, tuple), "array"), (str, "string"), (bool, "boolean"),
                        ((int, float), "number")):
        if isinstance(value, kinds):
            return name
    return "null"


def json_lines(text: str) -> list[Any]:
    """The value of each line of a JSON-lines text; a line that is not JSON (torn: its writer died mid-write) is
    skipped."""
    out = []
    for line in text.splitlines():
        with suppress(ValueError):
            out.append(json.loads(line))
    return out


def checked_json_lines(data: bytes) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    """([(line number, value)] of each line of a JSON-lines file that reads, [(line number, why)] of each that does
    not: not UTF-8, or not JSON (the last one cut short: its writer died mid-write). Blank lines are neither."""
    values, bad = [], []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            values.append((number, json.loads(raw.decode("utf-8"))))
        except UnicodeDecodeError as e:
            bad.append((number, f"it is not UTF-8 text (byte 0x{raw[e.start]:02x})"))
        except (ValueError, RecursionError):
            torn = number == len(lines)  # no newline after it
            bad.append((number, "it is not JSON" + (" (cut short: its rank died mid-write)" if torn else "")))
    return values, bad


def is_step(value: Any) -> bool:
    """Whether ``value`` is a step number as the records hold it: an int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float as None: strict JSON, which every parser reads (a diverged loss is
    null, and the run's status says why)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
