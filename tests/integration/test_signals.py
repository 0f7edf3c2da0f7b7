"""A signal to the launcher (Ctrl-C = SIGINT, `kill` = SIGTERM) while ranks train: every rank is stopped, the summary
says `interrupted` and by what, the exit code is 128 + the signal, and no traceback is printed; also when the signal
goes to the launcher's whole process group (Ctrl-C in a terminal, `timeout`) while a rank is stuck."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.rundir import RunDir
from tests.conftest import pid_alive, start_training
from tests.launch.test_toy_backend import TOY_BACKEND

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGUSR1, 138)],
                         ids=["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_signal_stops_every_rank_and_writes_the_summary(tmp_path, sig, code):
    launcher, run_dir, pids = start_training(tmp_path)
    t0 = time.monotonic()
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=60)
    stop_s = time.monotonic() - t0
    print(f"{sig.name}: launcher exited {launcher.returncode} after {stop_s:.1f} s")
    assert launcher.returncode == code, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err and f"interrupted by {sig.name}" in out, err[-3000:] + out[-1000:]
    assert not any(pid_alive(p) for p in pids)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == sig.name
    assert (run_dir / "junit.xml").exists()
    assert stop_s < 15


def test_a_second_ctrl_c_kills_ranks_that_ignore_sigterm_at_once(tmp_path):
    script = Path(__file__).parents[1] / "data" / "ignore_sigterm.py"
    launcher = subprocess.Popen([sys.executable, "-m", "launcher.cli", f"script={script}", "--", str(tmp_path)],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*.pid"))) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    launcher.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert launcher.poll() is None and all(pid_alive(p) for p in pids)  # SIGTERM sent, ignored: the grace runs
    t0 = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=30)
    print(f"second SIGINT: launcher exited {launcher.returncode} after {time.monotonic() - t0:.1f} s")
    assert launcher.returncode == 130 and time.monotonic() - t0 < 5, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err and not any(pid_alive(p) for p in pids)


HANG = """
import os, time
from pathlib import Path
import torch
from torch import nn


class Net(nn.Module):
    \"\"\"Rank 1 sleeps in its first training forward (after saying so in the run dir); rank 0 then waits in DDP.\"\"\"

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x):
        if self.training and x.device.type != "meta" and os.environ.get("RANK") == "1":
            (Path(os.environ["HL_RUN_DIR"]) / "hanging").touch()
            time.sleep(3600)
        return self.layer(x).squeeze(-1)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((4,), float(i))
        return x, x.sum()
"""
HANG_RECIPE = """# @package _global_
recipe: {name: hang}
model: {_target_: hang.Net}
data: {_target_: hang.Data}
loss: {_target_: torch.nn.MSELoss}
optimizer: {name: sgd, lr: 0.01}
batch: {global_size: 8}
trainer: {steps: 4, checkpoint_every: -1}
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_launchers_process_group_stops_stuck_ranks_before_it_returns(tmp_path, sig):
    """As `timeout` or a closed terminal do: the launcher leads its own group and the signal goes to the group. The
    warm ranks' forkserver has a session of its own, so it is not signalled with the launcher: the ranks are stopped
    by the launcher and reaped before it returns (before, the forkserver died, its ranks outlived the launcher as
    orphans for a moment and were recorded with exit code 255)."""
    (tmp_path / "hang.py").write_text(HANG)
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "hang.yaml").write_text(HANG_RECIPE)
    launcher = subprocess.Popen([sys.executable, "-m", "launcher.cli", "--config-dir", "conf", "recipe=hang",
                                 "cluster.nproc_per_node=2"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        run_dir, pids = _stuck(launcher, tmp_path / "log_output" / "latest")
        os.killpg(launcher.pid, sig)
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:  # the test failed: its ranks die with the launcher (lifeline)
            launcher.kill()
    assert launcher.returncode == 128 + sig, out[-2000:] + err[-2000:]
    assert not any(pid_alive(p) for p in pids)
    assert not any(Path(f"/proc/{p}").exists() for p in pids)  # not even a zombie: reaped before the launcher ended
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == sig.name, summary
    assert [(r["exit_code"], r["stopped_by_launcher"]) for r in summary["ranks"]] == [(-signal.SIGTERM, True)] * 2
    assert "Traceback" not in out + err and f"interrupted by {sig.name}" in out


def _stuck(launcher: subprocess.Popen, latest: Path) -> tuple[Path, list[int]]:
    """Once rank 1 sleeps in its forward (and rank 0 waits for it in a collective): the run dir, the ranks' pids."""
    deadline = time.monotonic() + 120
    while not (latest / "hanging").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    run_dir = latest.resolve()
    assert json.loads((run_dir / "plan.json").read_text())["warm_start"] is True
    time.sleep(0.5)  # rank 0 reaches the collective that waits for rank 1
    return run_dir, [RunDir(run_dir).rank(r).read_pid()[1] for r in (0, 1)]


SIGNALLING_BACKEND = '''
"""cluster.launch=signalling: tests/launch/test_toy_backend.py's toy backend, which gets SIGTERM (as from Ctrl-C or
a CI cancel) after it started rank 0 and before rank 1: a stop signal while the ranks are being started."""

import json
import os
import signal
import time

from launcher.backends import register
from toy_backend import PopenJob, ToyBackend


class SignallingBackend(ToyBackend):
    name = "signalling"
    help = "signalling (a test's own: SIGTERM to the launcher between two ranks' starts)"

    def start(self, config, plan, run_dir, envs):
        first, *rest = sorted(envs)
        started = super().start(config, plan, run_dir, {first: envs[first]})._procs
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # delivered here, in the middle of the start
        started.update(super().start(config, plan, run_dir, {r: envs[r] for r in rest})._procs)
        (run_dir.path / "pids.json").write_text(json.dumps([p.pid for p in started.values()]))
        return PopenJob(started)


register(SignallingBackend())
'''

RUN_WITH_BACKEND = """import sys
sys.path.insert(0, sys.argv[1])
import signalling_backend  # noqa: F401
from launcher.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_signal_while_the_ranks_are_started_stops_those_started_without_a_traceback(tmp_path):
    """Before, SIGTERM while a backend started the ranks raised out of the start: a traceback, exit 1, and the ranks
    started so far left to die with their parent. Now it is held until the job exists, which it then stops."""
    package = tmp_path / "backend"
    package.mkdir()
    (package / "toy_backend.py").write_text(TOY_BACKEND)
    (package / "signalling_backend.py").write_text(SIGNALLING_BACKEND)
    (package / "run.py").write_text(RUN_WITH_BACKEND)
    res = subprocess.run([sys.executable, str(package / "run.py"), str(package), "recipe=quickstart",
                          "cluster.launch=signalling", "cluster.nproc_per_node=2", "trainer.steps=50",
                          "output.run_name=held"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 143 and "Traceback" not in out, out[-3000:]
    run_dir = tmp_path / "log_output" / "held"
    assert not any(pid_alive(p) for p in json.loads((run_dir / "pids.json").read_text()))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM"
    assert all(r["stopped_by_launcher"] for r in summary["ranks"]), summary["ranks"]
