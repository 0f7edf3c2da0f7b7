"""Warm-started ranks (launcher.warm_start, the default for a recipe on CPU: forked from a forkserver that imported
torch and the worker once) train exactly as fresh ``python -m launcher.worker`` ranks do, and each is a rank of its
own: its own session, its variables (the ones torch reads at import included), its output in rank.N/, and gone
with the run, with what it forked; the forkserver stays for the launcher's next run. One warm and one cold run of the
same recipe, compared step by step."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import pid_alive, processes_of_run, run_cli, run_one_file_project

pytestmark = pytest.mark.integration

COMMON = ["recipe=quickstart", "trainer.steps=6", "trainer.log_every=1", "trainer.checkpoint_every=-1"]
PROBE = """
import json, multiprocessing, os, torch
from torch import nn

print("probe", json.dumps({"sid": os.getsid(0) == os.getpid(), "threads": torch.get_num_threads(),
      "start_method": multiprocessing.get_start_method(),
      "omp": os.environ.get("OMP_NUM_THREADS"), "run_dir": os.environ.get("HL_RUN_DIR"),
      "unbuffered": os.environ.get("PYTHONUNBUFFERED")}), flush=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x).squeeze(-1)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return x, x.sum()
"""
RECIPE = """# @package _global_
recipe: {name: probe}
model: {_target_: probe.Net}
data: {_target_: probe.Data}
loss: {_target_: torch.nn.MSELoss}
optimizer: {name: sgd, lr: 0.01}
batch: {global_size: 8}
trainer: {steps: 2, checkpoint_every: -1}
"""


def losses(run: Path) -> dict[int, float]:
    records = map(json.loads, (run / "rank.0" / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if "event" not in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    cwd = tmp_path_factory.mktemp("warm")
    out = {}
    for name, extra in (("warm", []), ("cold", ["launcher.warm_start=false"])):
        res = run_cli([*COMMON, f"output.run_name={name}", *extra], cwd)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        out[name] = cwd / "log_output" / name
    return out


def test_warm_ranks_train_exactly_as_fresh_ones(runs):
    warm, cold = (json.loads((runs[n] / "plan.json").read_text()) for n in ("warm", "cold"))
    assert warm["warm_start"] is True and cold["warm_start"] is False
    assert losses(runs["warm"]) == losses(runs["cold"]) and len(losses(runs["warm"])) == 6
    for n in ("warm", "cold"):
        summary = json.loads((runs[n] / "summary.json").read_text())
        assert [r["exit_code"] for r in summary["ranks"]] == [0, 0]
        assert not processes_of_run(runs[n]), processes_of_run(runs[n])  # the ranks went with the run


def test_a_warm_rank_has_its_own_session_variables_and_threads(tmp_path):
    """The probe runs in each rank when the user's module is imported there: what torch and the environment say."""
    res, run = run_one_file_project(tmp_path, "probe", PROBE, "probe", RECIPE, "cluster.nproc_per_node=2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((run / "plan.json").read_text())["warm_start"] is True
    for rank in (0, 1):
        lines = [ln for ln in (run / f"rank.{rank}" / "stdout").read_text().splitlines() if ln.startswith("probe ")]
        seen = json.loads(lines[-1][len("probe "):])
        assert seen["sid"] is True and seen["run_dir"] == str(run) and seen["unbuffered"] == "1", seen
        assert str(seen["threads"]) == seen["omp"], seen  # OMP_NUM_THREADS of the plan, read when torch loaded
        assert seen["start_method"] == "fork", seen  # a DataLoader's workers fork from the rank, as from a fresh one


def test_ranks_die_with_a_killed_launcher(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "launcher.cli", *COMMON, "trainer.steps=100000",
                                 "output.run_name=killed"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})
    run = tmp_path / "log_output" / "killed"
    deadline = time.monotonic() + 120
    while not list(run.glob("rank.*/metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of_run(run), "no rank of the run started"
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 20
    while processes_of_run(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of_run(run), processes_of_run(run)


LINGERS = PROBE.replace('print("probe"', '''if os.environ.get("RANK") is not None and os.fork() == 0:  # ranks only
    os.setsid()  # out of the rank's session and process group, which the stop signals
    with open(f"lingering.{os.environ['RANK']}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
    os._exit(0)
print("probe"''').replace("import json, multiprocessing, os, torch", "import json, multiprocessing, os, time, torch")


def test_a_warm_ranks_forked_child_goes_with_the_run(tmp_path):
    """A process a warm rank forked (as a DataLoader worker is) shows the forkserver's environment in /proc, without
    the run dir: the launcher still finds it at the run's end (forked from its forkserver), even out of the rank's
    process group, and returns only once it is gone."""
    res, run = run_one_file_project(tmp_path, "probe", LINGERS, "probe", RECIPE, "cluster.nproc_per_node=2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((run / "plan.json").read_text())["warm_start"] is True
    children = [int((tmp_path / f"lingering.{rank}").read_text()) for rank in (0, 1)]
    assert not any(pid_alive(pid) for pid in children), children
    assert not processes_of_run(run), processes_of_run(run)
