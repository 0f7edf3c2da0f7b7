"""What the command line's overrides may not do, checked as the config is composed (launcher/config.py): set Hydra's
own run settings (which hetero-launch does not use), leave a competing pair (steps and epochs) undecided, or hold a
value Hydra's grammar cannot read unquoted."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

HYDRA_HINTS = {"hydra.run.dir": "a run's files go to output.log_dir/<run name>: set output.log_dir={v} (and "
                                 "output.run_name=<name> to name the run's own folder)",
               "hydra.sweep.dir": "a sweep's runs go to output.log_dir/sweep-<date>-<time>/<job>: set "
                                   "output.log_dir={v}",
               "hydra.sweep.subdir": "a sweep's jobs are numbered folders of its sweep dir",
               "hydra.job.chdir": "ranks run in the folder hetero-launch is started in"}
"""What a user who writes one of Hydra's own run settings wants instead."""


def quote_hint(overrides: list[str]) -> str:
    """For the first override whose value Hydra's grammar cannot read as it is (>50K, a space, a colon): how to quote
    it, on the command line and in a shell."""
    for line in overrides:
        key, sep, value = line.partition("=")
        if not sep or not value or value[0] in "'\"":
            continue
        try:
            OverridesParser.create().parse_overrides([line])
        except HydraException:
            return (f" A value with characters Hydra's grammar reserves is quoted: {key}='{value}' (in a shell, "
                    f"\"{key}='{value}'\").")
    return ""


def hydra_keys(parsed, quiet: tuple[str, ...] = ()) -> list[str]:
    """Hydra's own settings on the command line (hydra.run.dir, hydra/launcher=...): hetero-launch composes the config
    with Hydra's compose API and runs the job itself, so they would do nothing. hydra.searchpath (more config folders)
    and the logging groups the launcher sets itself are what compose reads."""
    out = []
    for o in parsed:
        key = o.key_or_group.lstrip("+~")
        if not key.startswith(("hydra.", "hydra/")) or key == "hydra.searchpath" or \
                f"{key}={o.value()}" in quiet:
            continue
        value = o.value()
        hint = HYDRA_HINTS.get(key, "remove it").format(v=value)
        out.append(f"{key}={value}: Hydra's own run settings do nothing here (hetero-launch composes the config "
                   f"with Hydra and runs the job itself): {hint}.")
    return out


def steps_or_epochs(cfg: DictConfig, parsed) -> list[str]:
    """trainer.steps and trainer.epochs compete (epochs > 0 trains that many passes instead of steps): the one the
    user wrote wins over a recipe's or data option's default (data=tabular's epochs: 5); both written is refused."""
    given = {o.key_or_group.lstrip("+~") for o in parsed}
    steps, epochs = "trainer.steps" in given, "trainer.epochs" in given
    if not steps or cfg.trainer.epochs <= 0:
        return []
    if epochs:
        return [f"trainer.steps={cfg.trainer.steps} and trainer.epochs={cfg.trainer.epochs:g} were both given: "
                f"epochs > 0 trains that many passes over the data instead of a number of steps. Give one of them "
                f"(trainer.epochs=0 to train trainer.steps steps)."]
    cfg.trainer.epochs = 0  # the user's steps over a default's epochs
    return []
