"""Elastic fault tolerance on torch's own rendezvous (cluster.launch=elastic, cluster.nnodes=1:2,
launcher.max_restarts=2), two "nodes" of 2 ranks each as launcher processes on loopback, each in its own folder, their
checkpoints in one shared folder (trainer.checkpoint_dir). One scenario per table placement, shared by every
assertion: node B's launcher is SIGKILLed mid-run (its ranks die with it) -> node A meets the rendezvous again alone,
plans for a world of 2 (the global batch kept: each rank's micro-batch doubled), resumes from the newest checkpoint and goes on;
node C starts mid-run -> it waits at the rendezvous, A sees it waiting and restarts to admit it; A and C finish as a
world of 4 with exit 0. The losses of A's world-2 attempt equal a fresh 2-rank run resumed from the same checkpoint.

Each world holds itself where the test acts, whatever the machine's load: the model is a user's model (wide_deep's,
by ``model._target_``) whose forward, with HOLD_ENV set (the nodes, not the reference run), writes a marker and waits
until its launcher ends it. In the first world of 4, rank 0 waits once the first checkpoint is complete (the test then
kills B: the world's other ranks, waiting for rank 0 and B's ranks in a collective, fail; A restarts). In a world of
2 (only A's ranks, after B is lost, run in one) every rank waits after HOLD_AFTER micro-batches, until A's launcher
ends them to admit C. Holds from the test lost races on a loaded machine: a SIGSTOP once 5 steps were logged came
after the world of 2 had trained all its steps, and the world of 4 had to be slower than the test's polling."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration

STEPS, EVERY = 150, 10
HOLD_ENV, CKPT_ENV, HOLD_AFTER = "HL_TEST_HOLD_DIR", "HL_TEST_CKPT_DIR", 6
HELD = ["recipe=wide_deep", "model._target_=held_model.HeldWideDeep", "smoke=true"]
HELD_MODEL = f"""
import glob, os, time
from launcher.recipes.wide_deep.model import WideDeep


def _hold(marker):
    open(marker, "w").close()
    while True:  # until the launcher ends this rank (a restart)
        time.sleep(0.1)


class HeldWideDeep(WideDeep):
    \"\"\"wide_deep's model; rank 0 of the first world of 4 waits once a checkpoint is complete, and a world of 2 (node
    A after B is lost) waits after {HOLD_AFTER} micro-batches.\"\"\"

    calls = 0

    def forward(self, *state):
        hold, world, rank = os.environ.get("{HOLD_ENV}"), os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
        if hold and self.training and world == "4" and rank == "0":
            done = glob.glob(os.path.join(os.environ["{CKPT_ENV}"], "step*", "checkpoint.json"))
            if done and not os.path.exists(os.path.join(hold, "held4")):
                _hold(os.path.join(hold, "held4"))
        if hold and self.training and world == "2":
            HeldWideDeep.calls += 1
            if HeldWideDeep.calls > {HOLD_AFTER}:
                _hold(os.path.join(hold, "held." + rank))
        return super().forward(*state)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listens(pid: int, port: int) -> bool:
    import psutil

    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.Process(pid).net_connections(kind="tcp"))


def _wait(what, cond, procs, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                raise AssertionError(f"a launcher ended while waiting for {what}: {p.returncode}\n{out[-4000:]}"
                                     f"\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _steps(metrics: Path) -> dict[int, float]:
    if not metrics.exists():
        return {}
    out = {}
    for line in metrics.read_text().splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if "loss" in m and "event" not in m:
            out[m["step"]] = m["loss"]
    return out


def _node_dir(cwd: Path) -> Path:
    """A node's (or the reference run's) folder, with the held model importable from it (its current directory)."""
    cwd.mkdir()
    (cwd / "held_model.py").write_text(HELD_MODEL)
    return cwd


def _node_steps(run: Path) -> dict[int, float]:
    """The losses the node's lowest rank logged (its node rank, and so its ranks, may change at each round)."""
    ranks = sorted(int(d.name.split(".")[1]) for d in run.glob("rank.*"))
    return _steps(run / f"rank.{ranks[0]}" / "metrics.jsonl") if ranks else {}


def _scenario(tmp_path: Path, placement: list[str]) -> dict:
    """Run the scenario once; what the assertions read."""
    port, shared = _free_port(), tmp_path / "shared_ckpt"
    args = [*HELD, f"trainer.steps={STEPS}", "trainer.log_every=1", "eval.batches=0",
            f"trainer.checkpoint_every={EVERY}", f"trainer.checkpoint_dir={shared}", *placement,
            "cluster.launch=elastic", "cluster.nnodes=1:2", "cluster.nproc_per_node=2", "launcher.max_restarts=2",
            f"cluster.rdzv_endpoint=127.0.0.1:{port}", f"cluster.rdzv_id=t{port}", "cluster.local_addr=127.0.0.1",
            "cluster.rdzv_timeout_s=120", "+cluster.rdzv_conf.last_call_timeout=2",
            "+cluster.rdzv_conf.keep_alive_interval=1", "+cluster.rdzv_conf.keep_alive_max_attempt=3"]

    hold = tmp_path / "held"
    hold.mkdir()

    def node(name: str) -> subprocess.Popen:
        cwd = _node_dir(tmp_path / name)
        return subprocess.Popen([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "200", HOLD_ENV: str(hold), CKPT_ENV: str(shared)})

    first = [node("a"), node("b")]  # together: both are in the first round (its last call is 2 s)
    _wait("the rendezvous", lambda: _listening(port), first)
    # the launcher that hosts the rendezvous' store at the endpoint must live (torch's c10d backend): it is "a"
    a, b = sorted(first, key=lambda p: not _listens(p.pid, port))
    run_a = tmp_path / ("a" if a is first[0] else "b") / "log_output" / "latest"
    _wait("the world of 4 to hold after its first checkpoint", lambda: (hold / "held4").exists(), [a, b])
    t_kill = time.time()
    b.kill()  # the launcher, SIGKILL: its ranks die with it (lifeline)
    b.communicate()
    _wait("node a's world of 2 to hold", lambda: len(list(hold.glob("held.*"))) == 2, [a])
    c = node("c")
    outs = {n: p.communicate(timeout=300) for n, p in (("a", a), ("c", c))}
    for n, p in (("a", a), ("c", c)):
        assert p.returncode == 0, f"node {n}: {p.returncode}\n" + outs[n][0][-5000:] + outs[n][1][-3000:]
    run_a = run_a.resolve()
    return {"run_a": run_a, "summary": json.loads((run_a / "summary.json").read_text()), "out_a": outs["a"][0],
            "shared": shared, "t_kill": t_kill, "args": args}


def _fresh_two_rank_losses(tmp_path: Path, sc: dict, step: int, until: int, placement: list[str]) -> dict[int, float]:
    """A one-node run of 2 ranks resumed from the checkpoint the world of 2 resumed from, with that world's batch, to
    step ``until`` (the last the world of 2 logged: a step's loss does not depend on how many follow it)."""
    plan = json.loads((sc["run_a"] / "attempt.1" / "plan.json").read_text())
    ref = _node_dir(tmp_path / "ref")
    res = run_cli([*HELD, f"trainer.steps={until}", "trainer.log_every=1",
                   "eval.batches=0", "trainer.checkpoint_every=-1", *placement, "cluster.nproc_per_node=2",
                   f"batch.global_size={plan['batch']['global_size']}", f"batch.micro_size={plan['batch']['micro_size']}",
                   f"batch.grad_accum={plan['batch']['grad_accum']}",
                   f"trainer.resume_from={sc['shared'] / f'step{step}'}"], ref)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _steps(ref / "log_output" / "latest" / "rank.0" / "metrics.jsonl")


def _check(tmp_path: Path, placement: list[str]) -> None:
    sc = _scenario(tmp_path, placement)
    attempts = sc["summary"]["attempts"]
    print(json.dumps(attempts, indent=1))
    assert [a["status"] for a in attempts] == ["failed", "admit", "ok"], attempts
    assert [a["world_size"] for a in attempts] == [4, 2, 4] and [a["nnodes"] for a in attempts] == [2, 1, 2]
    assert len(attempts[1]["left"]) == 1 and not attempts[1]["joined"]
    assert len(attempts[2]["joined"]) == 1 and not attempts[2]["left"]
    resumed = attempts[1]["resumed_step"]
    assert resumed is not None and resumed % EVERY == 0 and resumed >= EVERY
    assert attempts[2]["resumed_step"] >= resumed and sc["summary"]["status"] == "ok"
    for a in attempts[1:]:
        print(f"restart to attempt {a['attempt']}: time lost {a['time_lost_s']} s")
        assert a["time_lost_s"] is not None and 0 < a["time_lost_s"] < 60
    assert "attempts (cluster.launch=elastic)" in sc["out_a"]
    plans = [json.loads((sc["run_a"] / f"attempt.{k}" / "plan.json").read_text()) for k in (0, 1)]
    assert plans[0]["batch"]["global_size"] == plans[1]["batch"]["global_size"]
    assert plans[1]["batch"]["micro_size"] == 2 * plans[0]["batch"]["micro_size"]  # the same global micro-batch
    world2 = _steps(sc["run_a"] / "attempt.1" / "rank.0" / "metrics.jsonl")
    assert min(world2) == resumed + 1 and len(world2) == HOLD_AFTER // plans[1]["batch"]["grad_accum"]
    fresh = _fresh_two_rank_losses(tmp_path, sc, resumed, max(world2), placement)
    assert sorted(fresh) == sorted(world2), (sorted(fresh), sorted(world2))
    worst = max(abs(world2[s] - fresh[s]) for s in world2)
    print(f"{placement}: world of 2 after the restart vs a fresh 2-rank run, {len(world2)} steps: worst {worst:.2e}")
    assert worst == 0.0, {s: (world2[s], fresh.get(s)) for s in sorted(world2)[:5]}
    final = _node_steps(sc["run_a"])
    assert max(final) == STEPS


def test_a_lost_node_and_a_joining_node_host_tables(tmp_path):
    _check(tmp_path, ["placement.host_device_mix=1"])


def test_a_lost_node_and_a_joining_node_ps_tables(tmp_path):
    _check(tmp_path, ["placement.ps=true"])
