"""No host whose loss ends an elastic job (issue 44): three namespaced hosts (tests/hosts.py), each with an etcd member
of one etcd cluster and its own hetero-launch, meet on torch's etcd-v2 rendezvous (cluster.rdzv_backend=etcd-v2,
cluster.rdzv_endpoint=127.0.0.1:2379: each host asks its own member). cluster.nnodes=2:3; the launcher of one host is
killed with SIGKILL mid-run (in separate runs, each host in turn, the one that started first and holds the ranks'
store, node 0, included): the two others' ranks lose their peers, the launchers meet again without it, resume from
the newest checkpoint in the shared folder, finish with exit 0, and their losses after the restart equal a fresh
2-rank run resumed from that checkpoint; the 3-host job's steps before the kill equal one host's 3 ranks. With c10d
the store lives in one launcher, and losing that host ends the job (tests/integration/test_hosts.py shows the other
direction).

Skipped where namespaces cannot be made (not root, no ``ip``) or without etcd and python-etcd, saying why."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hosts import Hosts, etcd_missing, last_step, missing

WHY = missing() or etcd_missing()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(WHY), reason=WHY or "")]

HEARTBEAT_S = 8
STEPS, EVERY = 100, 10
BASE = ["recipe=wide_deep", "smoke=true", "trainer.log_every=1", "eval.batches=0", "batch.global_size=48"]


def _steps(metrics: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return {r["step"]: r["loss"] for r in recs if "loss" in r and "event" not in r}


def _job(tmp: Path, victim: int, cut: bool = False, heartbeat_s: float = HEARTBEAT_S) -> dict:
    """Three hosts train; once step 22 is logged, host ``victim``'s launcher is SIGKILLed (``cut``: its link is cut
    instead, its etcd member with it). What each launcher said and how it ended, the survivors' run dirs, what is
    left in the victim's namespace."""
    shared = tmp / "shared"
    args = [*BASE, f"trainer.steps={STEPS}", f"trainer.checkpoint_every={EVERY}", f"trainer.checkpoint_dir={shared}",
            "launcher.max_restarts=1", "cluster.launch=elastic", "cluster.nnodes=2:3", "cluster.nproc_per_node=1",
            "cluster.rdzv_backend=etcd-v2", "cluster.rdzv_endpoint=127.0.0.1:2379", f"cluster.rdzv_id=kill{victim}",
            "cluster.rdzv_timeout_s=90", f"cluster.heartbeat_timeout_s={heartbeat_s:g}",
            "+cluster.rdzv_conf.last_call_timeout=5", "+cluster.rdzv_conf.keep_alive_interval=1",
            "+cluster.rdzv_conf.keep_alive_max_attempt=3"]
    with Hosts(3) as hosts:
        hosts.etcd()
        procs = []
        for i, name in enumerate(hosts.names):
            (tmp / name).mkdir()
            procs.append(hosts.run(i, [sys.executable, "-m", "launcher.cli", *args], cwd=tmp / name,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "COLUMNS": "200"}))
        runs = [tmp / name / "log_output" / "latest" for name in hosts.names]
        deadline = time.monotonic() + 240
        while max([last_step(r) for r in runs if r.exists()], default=0) < 22:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "the job never reached step 22"
            time.sleep(0.2)
        if cut:
            hosts.cut(victim)
        else:
            os.kill(procs[victim].pid, signal.SIGKILL)
        since, outs, victim_s = time.monotonic(), {}, None
        if cut:  # it leaves on its own
            outs[victim] = procs[victim].communicate(timeout=300)
            victim_s = time.monotonic() - since
        outs.update({i: procs[i].communicate(timeout=300) for i in range(3) if i != victim})
        time.sleep(1.0)  # the victim's ranks end when its launcher's forkserver does
        left = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in hosts.pids(victim)
                if Path(f"/proc/{pid}/comm").exists()]
        names = hosts.names
    survivors = [i for i in range(3) if i != victim]
    return {"procs": procs, "outs": outs, "left": left, "survivors": survivors, "names": names, "shared": shared,
            "runs": {i: runs[i].resolve() for i in survivors}, "victim_s": victim_s}


def _fresh_two_rank(tmp: Path, job: dict, run: Path, step: int, until: int) -> dict[int, float]:
    """A one-host 2-rank run resumed from checkpoint ``step`` with the batch of the world of 2, to step ``until``."""
    plan = json.loads((run / "plan.json").read_text())
    ref = tmp / "ref"
    ref.mkdir()
    res = run_cli([*BASE, f"trainer.steps={until}", "trainer.checkpoint_every=-1", "cluster.nproc_per_node=2",
                   f"batch.global_size={plan['batch']['global_size']}",
                   f"batch.micro_size={plan['batch']['micro_size']}",
                   f"batch.grad_accum={plan['batch']['grad_accum']}",
                   f"trainer.resume_from={job['shared'] / f'step{step}'}"], ref)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _steps(ref / "log_output" / "latest" / "rank.0" / "metrics.jsonl")


@pytest.mark.parametrize("victim", [0, 1, 2])
def test_an_elastic_job_on_etcd_goes_on_without_any_one_host(tmp_path, victim):
    job = _job(tmp_path, victim)
    name = job["names"][victim]
    for i in job["survivors"]:
        out, err = job["outs"][i]
        assert job["procs"][i].returncode == 0, f"h{i}: {job['procs'][i].returncode}\n{out[-5000:]}\n{err[-3000:]}"
        said = " ".join(out.replace("│", " ").split())
        assert f"{name} (launcher {name}:" in said, said[-3000:]  # the attempts' table: who left
    assert job["left"] in ([], ["etcd"]), job["left"]  # only the host's etcd member: no launcher, no rank
    # the world of 2: node 0 of the second round holds global rank 0
    run = next(job["runs"][i] for i in job["survivors"] if (job["runs"][i] / "rank.0" / "metrics.jsonl").exists())
    summary = json.loads((run / "summary.json").read_text())
    first, second = summary["attempts"]
    # its ranks died with it (their forkserver's end): the others' ranks lost their peers at once, before its
    # silence reached the heartbeat timeout; the round that followed is the one without it
    assert first["status"] == "failed" and "hung_ranks" not in first, first
    assert second["status"] == "ok" and second["world_size"] == 2 and second["left"][0].startswith(f"{name} ")
    resumed = second["resumed_step"]
    assert resumed in range(20, STEPS - EVERY, EVERY), second  # its ranks took a moment to follow it
    before = max(max(_steps(m), default=0) for m in run.glob("attempt.0/rank.*/metrics.jsonl"))
    # the newest checkpoint (one being written when the ranks failed is not intact: the one before it)
    assert resumed in (before // EVERY * EVERY, before // EVERY * EVERY - EVERY), (resumed, before)
    world2 = _steps(run / "rank.0" / "metrics.jsonl")
    assert min(world2) == resumed + 1 and max(world2) == STEPS, sorted(world2)
    fresh = _fresh_two_rank(tmp_path, job, run, resumed, STEPS)
    assert sorted(fresh) == sorted(world2)
    worst = max(abs(world2[s] - fresh[s]) for s in world2)
    print(f"h{victim} killed: resumed from step {resumed}, {len(world2)} steps on 2 hosts vs a fresh 2-rank resume: "
          f"worst {worst:.2e}; time lost {second.get('time_lost_s')} s")
    assert worst <= 1e-6, {s: (world2[s], fresh[s]) for s in sorted(world2)[:5]}
    if victim == 2:  # h0 lived: its first attempt's rank 0 is the 3-host job's, which equals 1 host of 3 ranks
        three = _steps(job["runs"][0] / "attempt.0" / "rank.0" / "metrics.jsonl")
        steps = [s for s in sorted(three) if s <= resumed]
        ref = tmp_path / "three"
        ref.mkdir()
        res = run_cli([*BASE, f"trainer.steps={len(steps)}", "trainer.checkpoint_every=-1",
                       "cluster.nproc_per_node=3"], ref)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        one_host = _steps(ref / "log_output" / "latest" / "rank.0" / "metrics.jsonl")
        assert steps == list(range(1, len(steps) + 1)) and sorted(one_host) == steps
        assert max(abs(three[s] - one_host[s]) for s in steps) <= 1e-6, [(three[s], one_host[s]) for s in steps[:5]]


def test_an_elastic_job_on_etcd_goes_on_when_the_first_hosts_link_is_cut(tmp_path):
    """The link of h0 cut (no connection reset: the ranks wait in a collective, and h0's etcd member is cut off from
    its quorum): the other two name h0 lost by the liveness check and finish without it; h0 says it lost the
    store and exits 1 within the timeout + 15 s."""
    heartbeat = 15  # above etcd's request timeout (~7 s) and election: a call to a member whose leader was cut waits
    job = _job(tmp_path, 0, cut=True, heartbeat_s=heartbeat)
    out, err = job["outs"][0]
    said = " ".join(out.replace("│", " ").split())
    assert job["procs"][0].returncode == 1 and job["victim_s"] <= heartbeat + 15, (job["victim_s"], said[-3000:])
    assert "the rendezvous store at cluster.rdzv_endpoint=127.0.0.1:2379 has not answered this host" in said, said
    for i in job["survivors"]:
        out, err = job["outs"][i]
        assert job["procs"][i].returncode == 0, f"h{i}: {job['procs'][i].returncode}\n{out[-5000:]}\n{err[-3000:]}"
        assert "host h0 (node 0, ranks 0) has not been heard from for" in " ".join(out.replace("│", " ").split())
        first, second = json.loads((job["runs"][i] / "summary.json").read_text())["attempts"]
        assert [h["hostname"] for h in first["lost_hosts"]] == ["h0"] and "hung_ranks" not in first, first
        assert second["status"] == "ok" and second["world_size"] == 2
