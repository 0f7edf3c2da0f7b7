"""Loggers: where rank 0 sends the metrics as they are logged, besides the run dir's ``rank.N/metrics.jsonl``.

The ``logger`` key names them: ``tensorboard`` (the default: event files in ``log_output/<run>/tensorboard/``), a
class of yours by ``_target_`` with its constructor's arguments, a list of those, or ``null`` / ``none`` (none)::

    hetero-launch recipe=quickstart                      # then: tensorboard --logdir log_output
    hetero-launch recipe=quickstart logger=none
    hetero-launch recipe=quickstart 'logger=[tensorboard, {_target_: my_project.logs.WandbLogger, project: ctr}]'
    hetero-launch recipe=quickstart 'logger={_target_: launcher.loggers.tensorboard.TensorBoardLogger, flush_secs: 2}'

(The value is given whole, as above: ``logger`` is a name by default, so ``logger._target_=...`` has no key to set.)

A logger is any class with these two methods (``MetricsLogger``). Rank 0 builds it with Hydra's ``instantiate``
before the first step and calls it at every logged training step, every evaluation and every ``runtime.log``::

    log_metrics(step: int, metrics: dict[str, float]) -> None   # {"train/loss": 0.71, "train/lr": 0.001, ...}
    close() -> None                                             # once, when the rank ends

Names: ``train/<key>`` for a training step's record (loss, samples_per_s, lr; the keys a script gives
``runtime.log``), ``eval/<key>`` for an evaluation's (loss; with eval.metrics=binary also auc, logloss, accuracy,
bayes_auc). The run dir is in the rank's environment (``HL_RUN_DIR``), for a logger that writes files there. A
class may say which packages it needs (``requires = ("wandb",)``): before any rank starts the launcher checks
those, that the ``_target_`` imports, that its constructor takes the given arguments and that it has both methods
(exit 2 otherwise, naming the key). At run time a logger that raises is reported once, as a warning in rank 0's
stderr, and is off for the rest of the run: training goes on, and the run's summary names it. Weights & Biases,
for example (WANDB_MODE=offline keeps it on the disk)::

    class WandbLogger:
        requires = ("wandb",)

        def __init__(self, project: str, name: str = "") -> None:
            import wandb

            self.run = wandb.init(project=project, name=name or None)

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            self.run.log(metrics, step=step)

        def close(self) -> None:
            self.run.finish()

This module is torch-free (the plan and the launcher's checks import it); the rank's side is ``launcher.loggers.sink``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from omegaconf import Container, OmegaConf

from launcher.errors import did_you_mean

__all__ = ["LOGGERS", "MetricsLogger", "check_loggers", "logger_specs"]

LOGGERS = {"tensorboard": "launcher.loggers.tensorboard.TensorBoardLogger"}
"""Loggers by short name (``logger=tensorboard``); any other class is named by its ``_target_``."""

OFF = ("none", "null", "off")
"""Values of ``logger`` (besides null, false and []) that mean no logger."""

LOGGER_OFF = "logger_off"
"""The metrics.jsonl event rank 0 writes when a logger fails and is dropped: ``{"event": "logger_off", "step": the step,
"logger": its index in plan.json's loggers, "in_<constructor|log_metrics|close>": 1}`` (the run's summary names it)."""

HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")


@runtime_checkable
class MetricsLogger(Protocol):
    """What rank 0 calls (see the module's docstring)."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _is_off(value: Any) -> bool:
    return value is None or value is False or value == [] or (isinstance(value, str) and value.lower() in OFF)


def _keyed(value: Any) -> list[tuple[str, Any]]:
    """(dotted key, item) of each logger the ``logger`` value names; [] when it names none."""
    if isinstance(value, Container):
        value = OmegaConf.to_container(value, resolve=True)
    if _is_off(value):
        return []
    if isinstance(value, (list, tuple)):
        return [(f"logger[{i}]", item) for i, item in enumerate(value) if not _is_off(item)]
    return [("logger", value)]


def _spec(key: str, item: Any) -> tuple[dict[str, Any] | None, str]:
    """(the item as a ``_target_`` spec, '') or (None, the problem)."""
    if isinstance(item, str) and item in LOGGERS:
        return {"_target_": LOGGERS[item]}, ""
    if isinstance(item, Mapping) and isinstance(item.get("_target_"), str) and item["_target_"].strip():
        return dict(item), ""
    hint = did_you_mean(str(item), [*LOGGERS, *OFF]) if isinstance(item, str) else ""
    return None, (f"{key}={item!r} is not a logger.{hint} Give {' or '.join(LOGGERS)}, a class of yours by _target_ "
                  f"({key}={{_target_: my_project.logs.MyLogger}}), a list of those, or none (no logger).")


def logger_specs(value: Any) -> tuple[tuple[dict[str, Any], ...], list[str]]:
    """(the ``_target_`` specs the ``logger`` value names, problems). Pure: nothing is imported."""
    specs, problems = [], []
    for key, item in _keyed(value):
        spec, problem = _spec(key, item)
        if spec is None:
            problems.append(problem)
        elif spec in specs:  # the same logger twice: every point written twice, into the same files
            problems.append(f"{key}: the same logger as an earlier entry ({spec.get('_target_')} with the same "
                            f"arguments) would write every point twice. Remove one.")
        else:
            specs.append(spec)
    return tuple(specs), problems


def _locate(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if not module:
        raise ImportError(f"{path!r} is not a dotted path (package.module.Class)")
    return getattr(importlib.import_module(module), name)


def _argument_problems(key: str, target: str, cls: Any, spec: Mapping[str, Any]) -> list[str]:
    """The spec's keys against the constructor's signature: unknown ones, required ones not given."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    given = [k for k in spec if k not in HYDRA_KEYS]
    problems = []
    for k in given:
        if k not in params:
            hint = did_you_mean(k, list(params), f"{key}.")
            problems.append(f"{key}.{k}={spec[k]!r}: {target}() has no argument {k}.{hint} "
                            f"Its arguments: {', '.join(params) or 'none'}.")
    for name, p in params.items():
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in given:
            problems.append(f"{key}.{name} is required by {target}() and not set. Give it: "
                            f"{key}={{_target_: {target}, {name}: <value>}}.")
    return problems


def _check_one(key: str, spec: Mapping[str, Any]) -> list[str]:
    target = spec["_target_"]
    try:
        cls = _locate(target)
    except Exception as e:  # noqa: BLE001 (the user's module may raise anything on import)
        return [f"{key}._target_={target} does not import: {type(e).__name__}: {e}. Check the dotted path and that "
                f"its package is importable from the folder you run in, or set logger=none."]
    if not callable(cls):
        return [f"{key}._target_={target} is a {type(cls).__name__}, not a class: name the logger's class, e.g. "
                f"{key}={{_target_: my_project.logs.MyLogger}}."]
    missing = [m for m in getattr(cls, "requires", ()) if importlib.util.find_spec(m) is None]
    if missing:
        return [f"{key}._target_={target} needs the Python package {', '.join(missing)}, which is not installed. "
                f"pip install {' '.join(missing)}, or set logger=none."]
    if inspect.isclass(cls):
        lacking = [m for m in ("log_metrics", "close") if not callable(getattr(cls, m, None))]
        if lacking:
            return [f"{key}._target_={target} has no {' and no '.join(lacking)} method: a logger has "
                    f"log_metrics(step, metrics) and close() (launcher.loggers.MetricsLogger)."]
    return _argument_problems(key, target, cls, spec)


def check_loggers(value: Any) -> list[str]:
    """Every problem of the ``logger`` value, before any rank starts: its shape, then each ``_target_`` (imported
    from the folder the launcher runs in, too), the packages it requires, its methods and arguments."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:  # the rank (python -m launcher.worker) imports from there; the console script does not
        sys.path.append(cwd)
    problems = []
    for key, item in _keyed(value):
        spec, problem = _spec(key, item)
        problems += [problem] if spec is None else _check_one(key, spec)
    return problems
