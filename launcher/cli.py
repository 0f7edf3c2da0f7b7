"""``hetero-launch recipe=<name> [key=value ...]``: compose, plan, then launch (or print, for a dry run).

Hydra's own flags (--help, --cfg job, --info, ...) are handed to a Hydra app; everything else composes through
launcher.config so that bad keys and values give one clear message (exit code 2) before anything starts."""

from __future__ import annotations

import sys

from launcher.errors import ConfigError
from launcher.terminal import launcher_console

HYDRA_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p",
               "--shell-completion", "-sc"}


def main(argv: list[str] | None = None) -> int:
    """Pick the subcommand (SUBCOMMANDS) from the arguments and run it; a ConfigError is one message, exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):  # no config: what is installed
        if argv[1:]:  # a word after it was ignored, silently
            return _print_error(ConfigError(f"{argv[0]} takes nothing after it (given: {' '.join(argv[1:])}). Run "
                                            f"hetero-launch {argv[0]} alone."))
        print(versions())
        return 0
    if argv[:1] == ["report"]:  # hetero-launch report RUN_DIR [RUN_DIR ...] [--into OUT]: no config, no overrides
        from launcher.report.merge import report_command

        return report_command(argv[1:], launcher_console())
    try:
        argv = _with_script_args(argv)
        config_dir, rest = _split_config_dir(argv)
        return SUBCOMMANDS[_subcommand(rest)](rest, config_dir, argv)
    except ConfigError as e:
        return _print_error(e)


def versions() -> str:
    """hetero-launch's version and those of the engines it drives, from the installed packages' metadata (nothing
    imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    engines = ", ".join(f"{n} {of(n)}" for n in ("torch", "deepspeed", "hydra-core", "omegaconf"))
    return f"hetero-launch {of('hetero-launch')} ({engines}; Python {sys.version.split()[0]})"


def _subcommand(rest: list[str]) -> str:
    """Which of SUBCOMMANDS the arguments (less --config-dir) ask for."""
    if rest[:1] == ["check"]:
        return "check"
    if any(a in ("-m", "--multirun") for a in rest):
        return "sweep"
    if _overrides_and_flags(rest)[1] in CONFIG_FLAGS:
        return "config"
    if any(a.split("=")[0] in HYDRA_FLAGS for a in rest):
        return "hydra"
    return "run"


CONFIG_FLAGS = (["--cfg", "job"], ["-c", "job"], ["--cfg", "job", "--resolve"], ["-c", "job", "--resolve"])
"""--cfg job: the config a run gets, as this launcher composes it (smoke profile and --config-dir included)."""


def _with_script_args(argv: list[str]) -> list[str]:
    """Everything after -- goes to the user's script, word for word (${x}, quotes, backslashes): one override."""
    if "--" not in argv:
        return argv
    from launcher.plan.script import script_args_override

    cut = argv.index("--")
    return [*argv[:cut], script_args_override(argv[cut + 1:])]


def _check_or_sweep(rest: list[str], config_dir: str | None, argv: list[str]) -> int:
    """``check [-m] [overrides]``: plan every job, start nothing; ``-m``: plan every job, then run them in turn."""
    from launcher.launch.sweep import check_jobs, run_sweep

    check = rest[:1] == ["check"]
    jobs = [a for a in rest[check:] if a not in ("-m", "--multirun")]
    return (check_jobs if check else run_sweep)(jobs, config_dir, launcher_console())


def _print_config(rest: list[str], config_dir: str | None, argv: list[str]) -> int:
    from omegaconf import OmegaConf

    from launcher.config import compose_config

    overrides, flags = _overrides_and_flags(rest)
    print(OmegaConf.to_yaml(compose_config(overrides, config_dir), resolve="--resolve" in flags), end="")
    return 0


def _hydra_flags(rest: list[str], config_dir: str | None, argv: list[str]) -> int:
    """Hydra's own flags (--help, --info, ...), handed to a Hydra app once our checks of the overrides passed."""
    from launcher.config import compose_config, table_path_override

    if completion := _completion(argv):  # Hydra's shell completion: its own words, straight through
        return _hydra_app(completion)
    overrides = _overrides_and_flags(rest)[0]
    if "--hydra-help" in argv:  # Hydra's own help: no config of ours
        return _hydra_app([a for a in argv if a == "--hydra-help"])
    if INFO_FLAGS & set(argv):
        if not any(o.startswith("recipe=") for o in overrides):
            argv.insert(0, "recipe=quickstart")  # these compose a config; any recipe lists the same groups
    else:
        compose_config(overrides, config_dir)  # our messages for bad keys, before Hydra prints anything
    return _hydra_app([table_path_override(a) for a in argv])  # compose_config rewrites them itself


INFO_FLAGS = {"--help", "-h", "--info", "-i"}
"""Hydra's flags that print about the app: they need no recipe (one is picked to compose a config)."""


def _completion(argv: list[str]) -> list[str]:
    """``-sc install=bash`` / ``--shell-completion query=bash`` ... for Hydra, a recipe added when none is given (the
    completion composes a config); [] when the arguments ask for no completion."""
    if not {"-sc", "--shell-completion"} & set(argv):
        return []
    return argv if any(w.startswith("recipe=") for w in argv) else ["recipe=quickstart", *argv]


def _run(rest: list[str], config_dir: str | None, argv: list[str]) -> int:
    """Compose, plan and show the plan; then launch it, or write it down (dry_run=true)."""
    from rich.markup import escape

    from launcher.config import compose_config
    from launcher.errors import printable
    from launcher.launch import launch_run
    from launcher.facts.host import probe_host
    from launcher.launch.planning import plan_run

    console = launcher_console()
    cfg = compose_config(rest, config_dir)
    try:  # Ctrl-C while planning (e.g. reading a big data file) is no error: nothing was started
        plan, lines = plan_run(cfg, probe_host(), config_dir)
    except KeyboardInterrupt:
        print("hetero-launch: interrupted while planning; nothing was started", file=sys.stderr)
        return 130
    for line in lines:  # about the user's data and model: their names shown, never obeyed or read as markup
        console.print(escape(printable(line)), highlight=False)
    _print_plan(console, plan, cfg)
    if cfg.dry_run:
        return _dry_run(console, cfg, plan, rest, config_dir)
    return launch_run(cfg, plan, console)


def _print_plan(console, plan, cfg) -> None:
    """The plan, compact or whole (output.full_plan); the run dir's plan.txt has it whole either way."""
    from launcher.report.plan_view import plan_views

    for view in plan_views(plan, cfg.output.full_plan, cfg.dry_run, console.width):
        console.print(view, highlight=plan.kind != "script")


def _dry_run(console, cfg, plan, rest: list[str], config_dir: str | None) -> int:
    """The run dir with every file a run starts with, and no process."""
    from pathlib import Path

    from launcher.launch import write_dry_run
    from launcher.parallel.choose import engine_config
    from launcher.report.plan_view import engine_config_view

    config_args = ["--config-dir", str(Path(config_dir).resolve())] if config_dir else []
    run_dir = write_dry_run(cfg, plan, [*config_args, *rest])  # job.sbatch runs the same arguments
    ds = engine_config(plan)
    if ds is not None:
        console.print("[bold]DeepSpeed config[/bold] (ds_config.json):")
        console.print(engine_config_view(ds, cfg.output.full_plan), soft_wrap=True)
    console.print(f"dry run: nothing started; plan written to {run_dir.path}")
    if run_dir.sbatch.exists():
        console.print(f"submit it to Slurm: sbatch {run_dir.sbatch}")
    return 0


SUBCOMMANDS = {"check": _check_or_sweep, "sweep": _check_or_sweep, "config": _print_config, "hydra": _hydra_flags,
               "run": _run}
"""What ``hetero-launch`` does, by what the arguments ask for (_subcommand): each takes (the arguments less
--config-dir, the config dir, all the arguments)."""


def _overrides_and_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """(key=value overrides, everything else: flags and their values)."""
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    return overrides, [a for a in args if a not in overrides]


def _split_config_dir(argv: list[str]) -> tuple[str | None, list[str]]:
    """Hydra's ``--config-dir DIR`` / ``--config-dir=DIR`` / ``-cd DIR`` (the user's config tree beside the
    package's) and the other arguments."""
    for i, a in enumerate(argv):
        for flag in ("--config-dir", "-cd"):
            if a == flag:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{flag} needs a folder: {flag} conf (the folder holding recipe/<name>.yaml).")
                return argv[i + 1], argv[:i] + argv[i + 2 :]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1], argv[:i] + argv[i + 1 :]
    return None, argv


def _print_error(e: ConfigError) -> int:
    """Every problem, one paragraph each, on stderr; exit code 2 (nothing was started)."""
    from rich.markup import escape

    from launcher.errors import printable

    # escape: messages quote values such as recompute=[all] or [[2, 4], [4, 1]], which rich would take for markup;
    # printable: and names from the user's data (a CSV header) that may hold a terminal's escape sequences
    launcher_console(stderr=True).print(f"[bold red]hetero-launch:[/bold red] {escape(printable(e.render()))}",
                                        highlight=False, soft_wrap=True)
    return 2


def _hydra_app(argv: list[str]) -> int:
    import hydra

    from launcher.schema import register_schemas

    register_schemas()

    @hydra.main(config_path="pkg://launcher.conf", config_name="config", version_base="1.3")
    def app(_cfg) -> None:  # only reached without an info flag; the flags print and return before it
        pass

    overrides, flags = _overrides_and_flags(argv)
    # the positionals together and first, the flags last: a flag's optional value (--info [what]) takes no override
    sys.argv = [sys.argv[0], "hydra/help=hetero_launch", "hydra.output_subdir=null", "hydra.run.dir=.",
                "hydra/job_logging=none", "hydra/hydra_logging=none", *overrides, *flags]
    app()
    return 0


def entry() -> None:
    """The ``hetero-launch`` command: main(), then out without the interpreter's teardown (launcher/fastexit.py)."""
    from launcher.fastexit import fast_exit

    fast_exit(main())


if __name__ == "__main__":
    entry()
