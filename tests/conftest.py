"""Shared fixtures: compose a recipe as the CLI does, a CPU-only host, and running the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.config import compose_config
from launcher.facts.host import extensions_dir, toolchain_path
from launcher.plan import HostFacts, plan_launch
from launcher.recipes import RECIPES
from launcher.rundir import RunDir

ALL_RECIPES = sorted(RECIPES)

LONG_FIRST = (
    "tests/integration/test_composability.py", "tests/test_hostile_input.py", "tests/integration/test_resume.py",
    "tests/test_schema_walk.py", "tests/integration/test_user_recipe.py", "tests/docs/test_doc_commands.py",
    "tests/integration/test_placement_runs.py",
    "tests/integration/test_elastic_restart.py", "tests/integration/test_memory_prediction.py",
    "tests/integration/test_sharding_runs.py", "tests/integration/test_ps_runs.py",
    "tests/integration/test_grad_clip.py", "tests/integration/test_pipeline_inputs.py",
    "tests/integration/test_accelerate_scripts.py", "tests/integration/test_hosts.py",
)
"""The longest test files, longest first (each 1-3 minutes of a worker under `./run.sh test`; measured Nov 2026).
The two workers take whole files (--dist loadfile) in the order conftest leaves them: these first, then the other
files that launch runs (marked integration), then the in-process ones, so that short files fill the end and the two
workers finish together instead of one running a long file alone. A file missing here only runs later. The first
file (4 ranks for ~5 min) takes one worker while the other takes the in-process files listed 2nd, 4th and 6th: a
2-rank run of many small collectives beside it ran 8x slower than alone (ZeRO-3: 13 s alone, 103-115 s beside it)."""


def pytest_configure(config):
    # xdist's loadfile otherwise sorts the files by their number of tests, most first: the files that launch runs
    # (a few tests, minutes each) then came last, and one worker ran the longest of them alone for minutes.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Whole files in the order LONG_FIRST says (see there); a stable sort, so a file's tests keep their order."""
    weight: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path not in weight:
            weight[path] = (LONG_FIRST.index(path) if path in LONG_FIRST
                            else len(LONG_FIRST) + (0 if item.get_closest_marker("integration") else 1))
    items.sort(key=lambda item: weight[item.nodeid.split("::", 1)[0]])


@pytest.fixture
def cpu_host() -> HostFacts:
    """This CI machine's shape: 2 cores, no accelerator; the real op cache (built once per machine)."""
    return HostFacts(hostname="ci", cpu_count=2, accelerators=0, extensions_dir=str(extensions_dir()))


def needs_torchrec() -> None:
    """Skip the calling test module when TorchRec does not import here (run.sh installs torchrec 1.9.2 with
    fbgemm-gpu-cpu 1.8.0, which load next to torch 2.13 on CPU; another torch may not load that FBGEMM build)."""
    try:
        import torchrec  # noqa: F401
    except Exception as e:  # noqa: BLE001 - FBGEMM's native library may fail to load with an OSError or RuntimeError
        import torch

        pytest.skip(f"torchrec does not import next to torch {torch.__version__} ({type(e).__name__}: {e}); run.sh "
                    f"installs torchrec 1.9.2 with fbgemm-gpu-cpu 1.8.0, tested with torch 2.13 (CPU)",
                    allow_module_level=True)


def plan_of(overrides: list[str], host: HostFacts, config_dir: str | None = None):
    """Compose and plan as the CLI does (the recipe's facts gathered first)."""
    from launcher.facts.preflight import gather_facts

    cfg = compose_config(overrides, config_dir)
    return plan_launch(cfg, host, gather_facts(cfg, config_dir))


def init_one_process_group():
    """A real 1-process gloo group on a free port, for code that needs torch.distributed in the test process.
    DeepSpeed loads its shm op from our cache."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):  # DeepSpeed's engine reads them
        os.environ.setdefault(key, value)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir())
    os.environ["PATH"] = toolchain_path()  # the ninja the launcher and the ranks build and check the ops with
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def run_cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `hetero-launch args` in cwd; wide terminal so messages are not wrapped. A run of a built-in recipe (no
    user code: ``launches_here``) runs the launcher's main() in this process (``_run_here``), any other one
    ``python -m launcher.cli`` (this interpreter) as a process of its own (``HL_TEST_SUBPROCESS=1``: every one)."""
    if launches_here(args, cwd):
        return _run_here(args, cwd, timeout)
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


NOT_HERE = ("script=", "++script=", "+script=", "--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn",
            "cluster.launch=", "hydra.", "+hydra.")
"""Arguments after which run_cli starts a process of its own: a user's code (a script, a config folder) would be
imported into this test process and stay there (sys.modules, sys.path) for the next test; other backends, sweeps and
Hydra's own settings and flags (HERE_NOT_FLAGS: Hydra's app sets sys.argv and the root logger's handlers) are left
as the CLI runs them."""
HERE_NOT_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve",
                  "--package", "-p", "--shell-completion", "-sc", "--version", "-V"}


def launches_here(args: list[str], cwd: Path) -> bool:
    """Whether run_cli runs these arguments in this process: the main thread (the launcher sets signal handlers), a
    built-in recipe's run with none of NOT_HERE / HERE_NOT_FLAGS and no ``_target_`` (a user's class), from a folder
    without Python files or a ``conf/`` (a user's project)."""
    import threading

    if os.environ.get("HL_TEST_SUBPROCESS") == "1" or threading.current_thread() is not threading.main_thread():
        return False
    if any(a.startswith(NOT_HERE) or a in HERE_NOT_FLAGS or "_target_" in a for a in args):
        return False
    return not (Path(cwd) / "conf").exists() and not any(Path(cwd).glob("*.py"))


class _Expired(BaseException):
    """run_cli's timeout in this process: a BaseException, so that none of the launcher's ``except Exception`` takes
    it for a failure of its own and goes on."""


def _run_here(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``python -m launcher.cli args`` without a new interpreter: main(args) in cwd, its output captured, an exception
    printed as the interpreter would (exit 1); then this process as it was before (``_kept_as_it_was``). Saves each
    launched run the launcher's start (Python, Hydra, torch: ~1.8 s of CPU, measured on the 2-core CI machine: 3.7
    against 5.5 s for a 2-rank smoke run). ``timeout``: the run's processes are killed and TimeoutExpired raised, as
    subprocess.run does."""
    import io
    import signal
    import traceback

    from launcher.cli import main

    out, err = io.StringIO(), io.StringIO()

    def expired(signum, frame):
        raise _Expired

    with _kept_as_it_was():
        os.environ["COLUMNS"] = "200"
        os.environ.pop("PYTEST_CURRENT_TEST", None)  # as from a shell; it names each test: a forkserver for each
        os.chdir(cwd)
        signal.signal(signal.SIGALRM, expired)
        signal.alarm(max(1, int(timeout)))
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(list(args))
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except Exception:  # noqa: BLE001 - the interpreter's traceback and exit code 1, as in a process
                    traceback.print_exc()
                    code = 1
        except _Expired:
            _stop_forkserver()
            _kill_children()
            raise subprocess.TimeoutExpired(["hetero-launch", *args], timeout, out.getvalue(), err.getvalue()) from None
        finally:
            signal.alarm(0)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _kept_as_it_was():
    """This process as before an in-process launch: its environment, folder, sys.path and sys.argv, the signal
    handlers the launch changed (only those: pytest's faulthandler holds the fatal signals below Python's view), each
    logger's level, handlers and propagation; multiprocessing's resource tracker stopped where the launch started
    it. The warm start's forkserver stays, as in a launcher's sweep: the next run with the same variables forks its
    ranks from it (launcher/backends/warm_start.py)."""
    import logging
    import signal
    from multiprocessing import forkserver, resource_tracker

    handlers = {s: signal.getsignal(s) for s in signal.valid_signals() if signal.getsignal(s) is not None}
    env, here, path, argv = dict(os.environ), os.getcwd(), list(sys.path), list(sys.argv)
    loggers = [logging.root, *(x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger))]
    kept = [(x, x.level, list(x.handlers), x.propagate, x.disabled) for x in loggers]
    preload, tracker = forkserver._forkserver._preload_modules, resource_tracker._resource_tracker._pid
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:], sys.argv[:] = path, argv
        for s, handler in handlers.items():
            if signal.getsignal(s) is not handler:
                with contextlib.suppress(OSError, ValueError, TypeError):
                    signal.signal(s, handler)
        for x, level, had, propagate, disabled in kept:
            x.setLevel(level)
            x.handlers[:], x.propagate, x.disabled = had, propagate, disabled
        forkserver._forkserver._preload_modules = preload
        if tracker is None:
            with contextlib.suppress(OSError, ChildProcessError):
                resource_tracker._resource_tracker._stop()


def _stop_forkserver() -> None:
    """The warm start's forkserver killed and reaped (a run that outlived its timeout): the next run starts one."""
    import signal
    from multiprocessing import forkserver

    from launcher.backends import warm_start

    if (pid := warm_start.forkserver_pid()) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # _stop alone waits for it, which a forked child may keep up
    with contextlib.suppress(OSError, ChildProcessError):
        forkserver._forkserver._stop()
    forkserver._forkserver._forkserver_pid = None
    warm_start._started_with = None


def _kill_children() -> None:
    """SIGKILL to every process this one started and its descendants (a run that outlived its timeout), reaped."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=10)


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(args, cwd)``: the launcher's main(args) in this process, in cwd, with run_cli's wide terminal; its exit
    code, stdout and stderr as run_cli returns them. For the many checks that end before any process starts (exit 2,
    --cfg job, dry runs): a subprocess adds ~1 s of starting Python and importing Hydra each, and tests nothing more
    (tests/test_cli.py's test_the_environment_that_chooses_how_ranks_run_is_checked_before_launch still proves a
    real process exits 2 without a traceback)."""
    from launcher.cli import main

    def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        monkeypatch.setenv("COLUMNS", "200")
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def processes_of_run(run_dir: Path) -> list[str]:
    """The command lines of this host's live processes (zombies left out) that belong to the run at run_dir: its
    path in their environment (the ranks and their children: HL_RUN_DIR) or in their command line (mpirun, srun,
    rank_start), or forked from its launcher's warm-start forkserver, the forkserver included (their environment
    names the launcher: ``launcher.json``), unless that launcher is this process (an in-process run's: the
    forkserver stays for the next run)."""
    from launcher.backends.warm_start import forkserver_pid
    from launcher.lifeline import FORKSERVER_PARENT_ENV

    needle = str(Path(run_dir).resolve()).encode()
    try:
        forked = f"{FORKSERVER_PARENT_ENV}={json.loads(RunDir(run_dir).launcher.read_text())['pid']}\0".encode()
    except (OSError, ValueError, KeyError):  # no launcher.json (yet)
        forked = needle
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            if needle not in cmdline and needle not in environ and forked not in environ:
                continue
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z" and int(proc.name) not in (os.getpid(), forkserver_pid()):
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def run_one_file_project(folder: Path, module: str, code: str, recipe: str, recipe_yaml: str, *overrides: str
                         ) -> tuple[subprocess.CompletedProcess, Path]:
    """A user's project of one module (``<module>.py``) and one recipe (``conf/recipe/<recipe>.yaml``) in folder,
    launched there (run_cli); (the result, the run dir ``latest`` names)."""
    (folder / f"{module}.py").write_text(code)
    (folder / "conf" / "recipe").mkdir(parents=True, exist_ok=True)
    (folder / "conf" / "recipe" / f"{recipe}.yaml").write_text(recipe_yaml)
    res = run_cli(["--config-dir", "conf", f"recipe={recipe}", *overrides], folder)
    return res, (folder / "log_output" / "latest").resolve()


def read_summary(cwd: Path) -> dict:
    return json.loads((cwd / "log_output" / "latest" / "summary.json").read_text())


def pid_alive(pid: int) -> bool:
    """Whether pid runs: a zombie (it ended; its parent, init for an orphan, has yet to reap it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc here: kill(pid, 0) is all there is
    return stat[stat.rindex(")") + 2] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (each rank leads its own group: its children are in it)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_nothing_survives(pids: list[int]) -> None:
    """No rank of pids is left, nor any process of its group (each rank leads its own group: its children too)."""
    assert not any(pid_alive(p) for p in pids)
    assert not any(group_alive(p) for p in pids)


def start_training(cwd: Path, *overrides: str, recipe: str = "quickstart") -> tuple[subprocess.Popen, Path, list[int]]:
    """The launcher on a recipe (quickstart; 2 ranks, endless steps), once both ranks have logged a few steps:
    (launcher process, run dir, the ranks' pids)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", f"recipe={recipe}", "trainer.steps=1000000", "trainer.log_every=1",
         "trainer.checkpoint_every=-1", "eval.batches=0", *overrides],
        cwd=cwd, env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = cwd / "log_output" / "latest" / "rank.1" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 5):  # both ranks are training
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    run_dir = (cwd / "log_output" / "latest").resolve()
    return launcher, run_dir, [RunDir(run_dir).rank(r).read_pid()[1] for r in (0, 1)]
