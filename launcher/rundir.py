"""The run dir, in one place: the name of every file in it and the readers and writers of its records.

Launch, worker and report ask this module for paths, so the layout can change here alone::

    <log_dir>/<run>/                      RunDir
        config.yaml plan.json plan.txt ds_config.json rank_table.json rank_env.json versions.json
        ops_build.log summary.json junit.xml loss.png throughput.png backend.log job.sbatch
        tensorboard/                      rank 0's TensorBoard event files (logger=tensorboard, the default)
        checkpoints/step<N>/              CheckpointDir: the parts' files (model/ through DCP, or DeepSpeed's),
                                          tables/ (DCP), trainer.<rank>.pt, checkpoint.json (written last)
        rank.<N>/                         RankDir
            stdout stderr error.json pid exit.json last_step metrics.jsonl memory.json tables.json hashing.json mesh.json
                                          prepared.json (a script's runtime.prepare())
        attempt.<k>/                      an earlier attempt's rank.<N>/ and plan.json (launcher.max_restarts)
    <log_dir>/latest -> <run> (or a sweep)
    <log_dir>/<sweep_id>/                 SweepDir: sweep.json, one run dir per job (0/, 1/, ...)

Torch-free and Hydra-free: the report imports it without the training stack."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError
from launcher.records import (DamagedRecord, checked_json_lines, finite, is_step, json_lines,  # noqa: F401
                              load_record, read_record)  # (re-exported: the run dir's readers, in one import)

__all__ = ["CheckpointDir", "DamagedRecord", "RankDir", "RunDir", "SweepDir", "check_log_dir", "create_run_dir",
           "create_sweep_dir", "is_step", "load_record", "point_latest"]


RUN_DIR_ENV = "HL_RUN_DIR"
"""The variable that tells every rank its run dir (plan.json, rank.N/): ``launcher.runtime`` reads it in a script."""

STACKS_SIGNAL = signal.SIGUSR1
"""The launcher's watchdog sends it to a stalled job's ranks: each writes every thread's Python stack to its stderr
(``register_stack_dump``) and goes on."""


def register_stack_dump() -> None:
    """In a rank: dump every thread's Python stack to stderr on STACKS_SIGNAL (faulthandler: works while the rank is
    blocked in C, e.g. inside a collective)."""
    import faulthandler
    import sys

    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


class CheckpointDir:
    """``<run>/checkpoints/step<N>/``: everything a resumed run loads (Trainer.save / Trainer.load)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.root = self.path.parent
        """DeepSpeed's save_dir ..."""
        self.tag = self.path.name
        """... and its tag."""
        self.dcp = self.path / "model"
        """The torch-native parts' model and optimizer, a torch.distributed.checkpoint folder (each rank's shards with
        their global shapes: loadable on another layout). DeepSpeed writes its own files beside instead."""
        self.tables = self.path / "tables"
        """Tables trained outside the parts and their optimizers' states (DCP; one copy of each table)."""
        self.meta = self.path / "checkpoint.json"
        """What the checkpoint was saved from (recipe, step, format, layout) and its files (``files``: each one's
        path relative to this folder, bytes and CRC-32; launcher/manifest.py): checked before a resume starts."""

    def trainer(self, rank: int) -> Path:
        """One rank's step, data position and RNG states."""
        return self.path / f"trainer.{rank}.pt"


class RankDir:
    """``<run>/rank.<N>/``: one rank's logs and records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stdout = path / "stdout"
        self.stderr = path / "stderr"
        self.error = path / "error.json"
        """Written by torch elastic's @record when the rank raises."""
        self.pid = path / "pid"
        """'<host> <pid>' of the rank's process (the worker writes it; under mpirun or srun rank_start first)."""
        self.exit = path / "exit.json"
        """cluster.launch=mpi|slurm: how the rank ended, {exit_code, time} (rank_start writes it; under the local
        backend the launcher sees its ranks end itself)."""
        self.heartbeat = path / "last_step"
        """The last finished step, its time, the rank's RSS and the host's available memory then, and ``state``:
        "saving" while the rank writes a checkpoint, as one JSON line rewritten in place (MetricsWriter.step_done,
        MetricsWriter.saving): the launcher's watchdog and failure report read it."""
        self.metrics = path / "metrics.jsonl"
        self.memory = path / "memory.json"
        self.tables = path / "tables.json"
        self.hashing = path / "hashing.json"
        """Tables that hash raw ids (tables.<name>.hash): per table, the ids this rank looked up while training, and
        per batch the distinct ids and the rows they landed in (launcher/tables/hashing.py HashStats)."""
        self.mesh = path / "mesh.json"
        self.sharding = path / "sharding.json"
        """Op-level sharding / tensor parallel: the local shapes each sharded operator computed on, per operator."""
        self.prepared = path / "prepared.json"
        """What a script's runtime.prepare() built: engine, offload, each table's place."""

    def read_metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's records; a line that does not read (torn: the rank died mid-write; a stray byte) is
        skipped."""
        return [value for _, value in self.metrics_lines()[0]]

    def metrics_lines(self) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
        """([(line number, value)] of metrics.jsonl's lines that read as JSON, [(line number, why)] of those that do
        not): a torn line or a stray byte loses that line, never the rest. A file that cannot be read at all is one
        skipped "line" 0; an absent one has no lines."""
        if not self.metrics.exists():
            return [], []
        try:
            data = self.metrics.read_bytes()
        except OSError as e:
            return [], [(0, f"the file cannot be read ({e.strerror or e})")]
        return checked_json_lines(data)

    def read_heartbeat(self) -> dict[str, Any]:
        """{step, time, rss, host_available[, state]} (bytes; {} before the first finished step or while being
        rewritten)."""
        beat = read_record(self.heartbeat)
        return beat if isinstance(beat, dict) else {}

    def recorded_step(self) -> int | None:
        """The last finished step its heartbeat records; None before the first, or when it is not a step."""
        step = self.read_heartbeat().get("step")
        return step if is_step(step) else None

    def last_step(self) -> int:
        """The last finished step (0 before the first, or for a heartbeat whose step is not an int >= 0)."""
        return self.recorded_step() or 0

    def write_exit(self, exit_code: int, when: float) -> None:
        self.exit.write_text(json.dumps({"exit_code": exit_code, "time": when}) + "\n")

    def read_exit(self) -> dict[str, Any] | None:
        """{exit_code, time (epoch s)} once the rank ended (mpi|slurm), else None."""
        rec = read_record(self.exit)
        return rec if isinstance(rec, dict) and isinstance(rec.get("exit_code"), int) else None

    def write_pid(self, pid: int) -> None:
        import socket

        self.pid.write_text(f"{socket.gethostname()} {pid}\n")

    def read_pid(self) -> tuple[str, int] | None:
        """(host name, pid) of the rank's process, else None."""
        try:
            host, pid = self.pid.read_text().split()
            return host, int(pid)
        except (OSError, ValueError):
            return None

    def error_message(self) -> str:
        """The message of error.json, or '' when there is none; where the exception was raised from another (torch's
        pipeline stage raises "[Stage 0] failed to run forward" from the error its forward hit), the first line of
        the root cause follows: "<message> (caused by RuntimeError: Tensor dtype mismatch! ...)"."""
        try:
            err = json.loads(self.error.read_text())
            msg = err.get("message")
            if not isinstance(msg, dict):
                return str(msg or "")
            root = root_cause(str(msg.get("extraInfo", {}).get("py_callstack", "")))
            text = str(msg["message"])
            return f"{text.rstrip()} (caused by {root})" if root and root not in text else text
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return ""


_CHAINED = re.compile(r"\n(?:The above exception was the direct cause of the following exception:|During handling "
                      r"of the above exception, another exception occurred:)\n")


def root_cause(callstack: str) -> str:
    """The first line of the first exception of a chained traceback (Python prints the root cause first), '' when
    the traceback has one exception."""
    blocks = _CHAINED.split(callstack)
    if len(blocks) < 2:
        return ""
    lines = [line for line in blocks[0].splitlines() if line.strip()]  # a header, indented frames, the exception
    return next((line.strip() for line in lines[1:] if not line.startswith(" ")), "")


class RunDir:
    """``<log_dir>/<run>/``: the record of one run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.config = self.path / "config.yaml"
        self.plan = self.path / "plan.json"
        self.plan_text = self.path / "plan.txt"
        """The whole plan as the console would print it with output.full_plan=true (launcher/report/plan_view.py)."""
        self.ds_config = self.path / "ds_config.json"
        self.rank_table = self.path / "rank_table.json"
        self.rank_env = self.path / "rank_env.json"
        self.versions = self.path / "versions.json"
        self.ops_build_log = self.path / "ops_build.log"
        self.backend_log = self.path / "backend.log"
        """cluster.launch=mpi|slurm: mpirun's or srun's own output (the ranks' is in rank.N/)."""
        self.sbatch = self.path / "job.sbatch"
        """cluster.launch=slurm, dry run: the batch script that runs this plan (sbatch job.sbatch)."""
        self.summary = self.path / "summary.json"
        self.launcher = self.path / "launcher.json"
        """Which process launched the run ({host, pid, started}): a run dir without a summary is then known as one
        whose launcher still runs, or one whose launcher died (report/plots.py)."""
        self.junit = self.path / "junit.xml"
        """The run's result for CI systems (launcher/report/junit.py)."""
        self.checkpoints = self.path / "checkpoints"
        self.tensorboard = self.path / "tensorboard"
        """Rank 0's TensorBoard event files (launcher.loggers.tensorboard; ``tensorboard --logdir``)."""

    def rank(self, rank: int) -> RankDir:
        return RankDir(self.path / f"rank.{rank}")

    def checkpoint(self, step: int) -> CheckpointDir:
        return CheckpointDir(self.checkpoints / f"step{step}")

    def newest_checkpoint(self) -> tuple[CheckpointDir, int] | None:
        """The newest complete checkpoint and its step: one whose checkpoint.json (written last, once every rank's
        part is on disk) reads back; a half-written one is never picked."""
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def complete_checkpoints(self) -> list[tuple[CheckpointDir, int]]:
        """Every complete checkpoint (its checkpoint.json reads back) with its step, oldest first."""
        return complete_checkpoints_in(self.checkpoints)

    def attempt(self, number: int) -> RunDir:
        """``attempt.<k>/``: an earlier attempt's rank dirs and plan.json (launcher.max_restarts)."""
        return RunDir(self.path / f"attempt.{number}")

    def plot(self, name: str) -> Path:
        return self.path / f"{name}.png"

    def write_json(self, path: Path, obj: Any) -> None:
        """Strict JSON (a NaN or inf is null), written beside and renamed over ``path``: a reader never sees a
        half-written file, and a failed write leaves the old one."""
        part = path.with_name(path.name + ".part")
        try:
            part.write_text(json.dumps(finite(obj), indent=2, allow_nan=False) + "\n")
            os.replace(part, path)
        except OSError:  # a full disk: no half-written .part left behind either
            part.unlink(missing_ok=True)
            raise

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())

    def read_plan(self) -> dict[str, Any]:
        """plan.json; DamagedRecord (a ValueError) when it does not read as a JSON object."""
        return load_record(self.plan)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.write_json(self.summary, summary)

    @property
    def reserved(self) -> Path:
        """1 MiB taken while the run runs, for its last records (launcher/launch/record.py reserve_space)."""
        return self.path / ".reserved"

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json, None before the launcher wrote it; DamagedRecord when it does not read as a JSON object."""
        return load_record(self.summary) if self.summary.exists() else None

    def ranks_on_disk(self) -> list[int]:
        """The N of every rank.<N>/ folder here, in order: the ranks a run dir whose plan.json is damaged holds."""
        found = (p.name.removeprefix("rank.") for p in self.path.glob("rank.*") if p.is_dir())
        return sorted(int(n) for n in found if n.isdigit())


def create_run_dir(log_dir: Path, run_name: str, prefix: str) -> RunDir:
    """Make a new run dir, never reusing one: an explicit run_name that exists is an error; otherwise
    <prefix>-<YYYYmmdd-HHMMSS>[-n]. An unwritable log_dir, or a ``latest`` there that is not a link, is a
    ConfigError (nothing was started, nothing made)."""
    check_log_dir(log_dir)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        if run_name:
            if Path(run_name).name != run_name or run_name in (".", ".."):  # the plan refused these; never escape
                raise ConfigError(f"output.run_name={run_name} must be one folder name inside output.log_dir. "
                                  f"E.g. output.run_name=exp1.")
            path = log_dir / run_name
            try:
                path.mkdir()
            except FileExistsError:
                raise ConfigError(
                    f"output.run_name={run_name}: {path} already exists and runs are never overwritten. "
                    f"Pick another output.run_name, or leave it empty for <recipe>-<timestamp>."
                ) from None
            return RunDir(path)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            path = log_dir / (f"{prefix}-{stamp}" + (f"-{n}" if n else ""))
            try:
                path.mkdir()
                return RunDir(path)
            except FileExistsError:
                continue
    except OSError as e:  # not writable, a file in the way, a path under /proc, a read-only file system, ...
        raise ConfigError(
            f"output.log_dir={log_dir}: cannot create the run dir there ({e.strerror}). "
            f"Set output.log_dir to a directory you can write."
        ) from None
    raise ConfigError(f"output.log_dir={log_dir}: 1000 runs named {prefix}-{stamp} already exist. Set output.run_name.")


def check_log_dir(log_dir: Path) -> None:
    """Before anything is made: output.log_dir is (or can become) a folder this process writes, and its ``latest``
    is absent or a symlink (which point_latest replaces; a folder or file of the user's there is never replaced).
    ConfigError naming the path and a fix."""
    key = f"output.log_dir={log_dir}"
    latest = log_dir / "latest"
    if os.path.lexists(latest) and not latest.is_symlink():
        raise ConfigError(f"{key}: {latest} is {'a folder' if latest.is_dir() else 'a file'}, not the link to the "
                          f"newest run that the launcher keeps there (each run replaces it). Move it away (mv {latest} "
                          f"{latest}.old) or set output.log_dir to another folder.")
    existing = log_dir
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if os.path.lexists(existing) and not existing.is_dir():
        what = "a file" if existing.is_file() else ("a broken symlink" if existing.is_symlink() else "not a folder")
        raise ConfigError(f"{key}: {existing} is {what}, so the run dir cannot be made there. Set output.log_dir to a "
                          f"folder (e.g. output.log_dir=log_output).")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {existing} is not writable by this user, so the run dir cannot be made there. Set "
                          f"output.log_dir to a folder you can write (e.g. output.log_dir=$HOME/log_output).")


def point_latest(log_dir: Path, run_dir: RunDir) -> None:
    """log_dir/latest -> run_dir (relative symlink, replaced atomically)."""
    tmp = log_dir / f".latest.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, log_dir / "latest")


SWEEP_PREFIX = "sweep-"
"""A sweep dir's name: sweep-<YYYYmmdd-HHMMSS>[-n]."""


class SweepDir:
    """``<log_dir>/<sweep_id>/``: one run dir per job (``0/``, ``1/``, ...), ``latest`` -> the newest job, and
    ``sweep.json`` (every job's overrides, status, final loss, eval, wall time)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.json = self.path / "sweep.json"

    def write(self, record: dict[str, Any]) -> None:
        self.json.write_text(json.dumps(record, indent=2) + "\n")


def create_sweep_dir(log_dir: Path) -> SweepDir:
    """A new ``sweep-<YYYYmmdd-HHMMSS>[-n]`` dir, never reused; an unwritable log_dir is a ConfigError."""
    return SweepDir(create_run_dir(log_dir, "", SWEEP_PREFIX.rstrip("-")).path)


def complete_checkpoints_in(folder: Path) -> list[tuple[CheckpointDir, int]]:
    """Every complete checkpoint (its checkpoint.json reads back) of a checkpoints folder with its step, oldest
    first (a run dir's checkpoints/, or trainer.checkpoint_dir)."""
    done = []
    for path in folder.glob("step*") if folder.is_dir() else ():
        ckpt = CheckpointDir(path)
        try:
            done.append((ckpt, int(json.loads(ckpt.meta.read_text())["step"])))
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
    return sorted(done, key=lambda c: c[1])
