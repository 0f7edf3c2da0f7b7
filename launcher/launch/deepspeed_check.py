"""deepspeed.config before launch: the file read from disk (planning is pure and reads none), and the merged config
the plan hands DeepSpeed checked by DeepSpeed's own parser (``DeepSpeedConfig``: its pydantic models refuse unknown
keys inside ``zero_optimization``, ``bf16``, ``fp16``, ...; a top-level key it never reads, which DeepSpeed itself
ignores silently, is refused here with a did-you-mean). The merge rule: launcher/parallel/deepspeed_file.py."""

from __future__ import annotations

import contextlib
import copy
import difflib
import io
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from launcher.errors import ConfigError, first_line


def read_deepspeed_file(cfg: DictConfig) -> DictConfig:
    """``cfg`` with deepspeed.config's JSON file read into it (deepspeed.source = the path); itself when the key is
    unset or a mapping. ConfigError naming the file for a missing file, bad JSON or a repeated key."""
    path = cfg.deepspeed.config
    if not isinstance(path, str):
        return cfg
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except OSError as e:
        raise ConfigError(f"deepspeed.config={path}: cannot read it ({e.strerror or e}). Give the path of a "
                          f"DeepSpeed JSON config (relative to {Path.cwd()}).") from None

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"key {twice[0]} is given twice")
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=no_repeats)
    except json.JSONDecodeError as e:
        raise ConfigError(f"deepspeed.config={path}: not JSON at line {e.lineno}, column {e.colno}: {e.msg}.") from None
    except ValueError as e:
        raise ConfigError(f"deepspeed.config={path}: {e} (DeepSpeed refuses that too). Keep one.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"deepspeed.config={path}: a DeepSpeed config is a JSON object ({{...}}), not a "
                          f"{type(data).__name__}.")
    cfg = copy.deepcopy(cfg)
    cfg.deepspeed.config = data
    cfg.deepspeed.source = path
    return cfg


class _Reads(dict):
    """A dict that remembers which keys were read (DeepSpeedConfig reads its keys with get, [] and in)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, k: str) -> Any:
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k: str, default: Any = None) -> Any:
        self.read.add(k)
        return super().get(k, default)

    def __contains__(self, k: object) -> bool:
        self.read.add(str(k))
        return super().__contains__(k)

    def __copy__(self) -> _Reads:  # DeepSpeedConfig parses a copy.copy of what it is given
        return self


def check_with_deepspeed(config: dict[str, Any], dp: int, source: str) -> None:
    """DeepSpeed's DeepSpeedConfig on the merged ``config`` (as one data-parallel rank's: without a process group it
    counts one rank, so train_batch_size is divided by ``dp``; our batch solver checked global = micro × accum × dp);
    ConfigError with its message, or naming a top-level key it never read."""
    probe = _Reads({**config, "train_batch_size": config["train_batch_size"] // dp})
    problems = _scalar_problems(config)
    if not problems:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            problems = _scheduler_problems(config.get("scheduler"))
    if problems:
        raise ConfigError([f"deepspeed.config {source}: {p}" for p in problems])
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            # imported here only (the plan imports no deepspeed); its accelerator and config messages kept off the
            # launcher's console (its logger keeps the stream it was made with)
            from deepspeed.runtime.config import DeepSpeedConfig

            DeepSpeedConfig(probe)
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError, AssertionError, ValueError: all say why
        raise ConfigError(f"deepspeed.config {source}: DeepSpeed's parser refuses the merged config: "
                          f"{_said(e)}. Fix the file (the dry run shows the merged config).") from None
    unread = sorted(set(config) - probe.read)
    if unread:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        known, zero = sorted(probe.read), set(DeepSpeedZeroConfig.model_fields)
        hints = [f"{k} (it belongs under zero_optimization)" if k in zero else
                 f"{k} (did you mean {c[0]}?)" if (c := difflib.get_close_matches(k, known, n=1)) else k
                 for k in unread]
        raise ConfigError(f"deepspeed.config {source}: DeepSpeed never reads {', '.join(hints)}: it would be "
                          f"ignored silently. Remove or correct it.")


SCALARS = {"steps_per_print": int, "wall_clock_breakdown": bool, "memory_breakdown": bool, "dump_state": bool,
           "prescale_gradients": bool, "gradient_predivide_factor": float}
"""Top-level values DeepSpeedConfig takes as they are and the engine then computes with (``step % steps_per_print``):
a wrong type failed in every rank at its first step."""


def _scalar_problems(config: dict[str, Any]) -> list[str]:
    out = []
    for key, kind in SCALARS.items():
        value = config.get(key)
        fits = isinstance(value, bool) if kind is bool else isinstance(value, (int, float) if kind is float else int) \
            and not isinstance(value, bool)
        if key in config and not fits:
            out.append(f"{key}={json.dumps(value)} is no {kind.__name__}, which DeepSpeed's engine computes with. "
                       f"Give {'true or false' if kind is bool else 'a number'}, or remove it.")
    return out


def _scheduler_problems(section: Any) -> list[str]:
    """The scheduler DeepSpeed's engine would build from ``scheduler`` (engine._scheduler_from_config: a class of
    deepspeed.runtime.lr_schedules or torch.optim.lr_scheduler, called with the optimizer and ``params``), checked
    before launch: it asserted, or raised a TypeError for a misspelt argument, in every rank."""
    if not isinstance(section, dict) or section.get("type") is None:
        return []
    import inspect

    import torch.optim.lr_scheduler as torch_schedules
    from deepspeed.runtime import lr_schedules

    name, params = section["type"], section.get("params") or {}
    found = [getattr(m, name) for m in (lr_schedules, torch_schedules) if isinstance(name, str) and hasattr(m, name)]
    if not found or not inspect.isclass(found[0]):
        close = difflib.get_close_matches(str(name), list(lr_schedules.VALID_LR_SCHEDULES), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return [f"scheduler.type={name} is no scheduler DeepSpeed builds{hint}: one of "
                f"{', '.join(lr_schedules.VALID_LR_SCHEDULES)}, or a torch.optim.lr_scheduler class."]
    if not isinstance(params, dict):
        return [f"scheduler.params is a {type(params).__name__}: give a mapping of {name}'s arguments."]
    signature = inspect.signature(found[0])
    try:
        signature.bind(None, **params)
    except TypeError as e:
        args = [a for a in list(signature.parameters)[1:] if a not in ("args", "kwargs")]
        return [f"scheduler.params: {name} does not take them ({e}). Its arguments: {', '.join(args)}."]
    return []


def _said(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if type(e).__name__ == "ValidationError" and len(lines) >= 3:  # "1 validation error for X", the field, why
        return f"{lines[0]}: {lines[1]}: {lines[2]}"
    return first_line(e) or type(e).__name__
