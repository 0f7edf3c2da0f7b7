"""Several hosts with network stacks of their own (tests/hosts.py: network namespaces on one bridge, each with its own
address, hostname and /etc/hosts), each running its own hetero-launch as on separate machines (issue 44): real TCP
between distinct addresses, not loopback.

- 2 hosts × 1 rank (cluster.launch=elastic) equal the 1-host 2-rank run, and every address the job advertises is
  the namespaced host's own (read from the job whose link is then cut, below: one 2-host job for both);
- hosts whose names resolve to 127.0.1.1 (Debian's /etc/hosts line): refused before launch naming
  cluster.local_addr, and with it the job runs;
- a link shaped to 20 Mbit/s and 50 ms (tc netem, where the kernel has it; else 20 Mbit/s by tbf): trains with no
  false lost host or hang;
- 2 hosts, static, the second host's link cut mid-run (no connection reset: a cable pulled): both launchers exit
  non-zero within cluster.heartbeat_timeout_s + 15 s, each naming the other host and its ranks, both summaries say
  which host was lost, and no process of the job is left in either namespace.

Skipped where namespaces cannot be made (not root, no ``ip``), saying why.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hosts import Hosts, last_step, missing
from tests.integration.test_placement_runs import assert_close, losses

WHY = missing()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(WHY), reason=WHY or "")]

HEARTBEAT_S = 8
BASE = ["recipe=wide_deep", "smoke=true", "trainer.log_every=1", "eval.batches=0", "trainer.checkpoint_every=-1"]


def _elastic(hosts: Hosts, port: int) -> list[str]:
    return ["cluster.launch=elastic", "cluster.nnodes=2", "cluster.nproc_per_node=1",
            f"cluster.rdzv_endpoint={hosts.addrs[0]}:{port}", "cluster.rdzv_id=ns", "cluster.rdzv_timeout_s=60",
            f"cluster.heartbeat_timeout_s={HEARTBEAT_S}"]


def _start(hosts: Hosts, tmp: Path, args: list[str], own=lambda i: []) -> list[subprocess.Popen]:
    """Every host's launcher with ``args`` and ``own(i)``, each in its own folder under ``tmp``."""
    procs = []
    for i in range(len(hosts.names)):
        cwd = tmp / hosts.names[i]
        cwd.mkdir(exist_ok=True)
        procs.append(hosts.run(i, [sys.executable, "-m", "launcher.cli", *args, *own(i)], cwd=cwd,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"}))
    return procs


def _run_until(procs: list[subprocess.Popen], run: Path, step: int) -> None:
    """Wait until the run dir's ranks logged ``step`` (every launcher still running)."""
    deadline = time.monotonic() + 240
    while last_step(run) < step:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, f"the job never reached step {step}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cut_job(tmp_path_factory) -> dict:
    """One static 2-host job (elastic, nnodes=2, 1 rank each) for the two tests below: it trains to step 20 or more,
    then host h1's link is cut. What it logged before the cut is what the 2-host job trained (the equality test); how
    the two launchers end is the cut's test. (Each used to launch a 2-host job of its own.)"""
    tmp = tmp_path_factory.mktemp("cut")
    with Hosts(2) as hosts:
        procs = _start(hosts, tmp, [*BASE, "trainer.steps=100000", *_elastic(hosts, 29401)])
        _run_until(procs, tmp / "h0" / "log_output" / "latest", 20)
        hosts.cut(1)
        cut = time.monotonic()
        outs = [p.communicate(timeout=HEARTBEAT_S + 60) for p in procs]
        took = time.monotonic() - cut  # the later of the two
        left = [hosts.pids(i) for i in range(2)]
    runs = [(tmp / h / "log_output" / "latest").resolve() for h in hosts.names]
    return {"procs": procs, "outs": outs, "took": took, "left": left, "runs": runs, "names": hosts.names,
            "addrs": hosts.addrs}


def test_two_hosts_equal_one_host_with_their_own_addresses(cut_job, tmp_path):
    """Every step the 2-host job logged before its cut (a step's loss does not depend on how many follow) equals the
    same step of the 1-host 2-rank run."""
    runs = cut_job["runs"]
    trained = losses(runs[0])  # rank 0 is on h0
    assert len(trained) >= 20, trained
    res = run_cli([*BASE, f"trainer.steps={len(trained)}", "cluster.nproc_per_node=2"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reference = losses(tmp_path / "log_output" / "latest")
    assert len(reference) == len(trained)
    assert_close(reference, trained, rel=1e-6)
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        # each host advertises its fully qualified name, which its /etc/hosts and the others' resolve to its address
        assert [(n["hostname"], n["addr"], n["ranks"]) for n in summary["nodes"]] == [("h0", "h0", [0]),
                                                                                      ("h1", "h1", [1])]
        table = json.dumps(json.loads((run / "rank_table.json").read_text()))
        assert '"h0"' in table and '"h1"' in table and "127.0" not in table and "localhost" not in table
        env = json.loads((run / "rank_env.json").read_text())
        assert {e["MASTER_ADDR"] for e in env.values()} == {"h0"}  # the ranks' store on h0


def test_a_cut_off_host_is_named_lost_on_both_hosts_and_both_exit_in_time(cut_job):
    procs, outs, names = cut_job["procs"], cut_job["outs"], cut_job["names"]
    assert cut_job["took"] <= HEARTBEAT_S + 15, cut_job["took"]
    assert all(p.returncode not in (0, None) for p in procs), [p.returncode for p in procs]
    assert cut_job["left"] == [[], []]  # no launcher or rank left in either namespace
    said = [" ".join((out + err).replace("│", " ").split()) for out, err in outs]  # (a panel's borders out)
    assert "host h1 (node 1, ranks 1) has not been heard from for" in said[0], said[0][-3000:]
    assert (f"the rendezvous store at cluster.rdzv_endpoint={cut_job['addrs'][0]}:29401 has not answered this host "
            f"for" in said[1] and "is cut off from host h0 (node 0, ranks 0), or that host is lost" in said[1]
            ), said[1][-3000:]
    for i, run in enumerate(cut_job["runs"]):
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "failed"
        assert [h["hostname"] for h in summary["lost_hosts"]] == [names[1 - i]], summary


def test_hosts_whose_names_resolve_to_loopback_are_refused_before_launch_then_run_with_local_addr(tmp_path):
    with Hosts(2, loopback_names=True) as hosts:
        procs = _start(hosts, tmp_path, [*BASE, "trainer.steps=5", *_elastic(hosts, 29402)])
        outs = [p.communicate(timeout=120) for p in procs]
        for i, (p, (out, err)) in enumerate(zip(procs, outs)):
            said = " ".join((out + err).replace("│", " ").split())
            assert p.returncode == 2, said[-3000:]
            assert (f"cluster.local_addr is empty and this host's name h{i} resolves to 127.0.1.1, a loopback "
                    f"address (/etc/hosts): the other hosts could not reach this one. Set cluster.local_addr to this "
                    f"host's address as the others reach it, e.g. cluster.local_addr={hosts.addrs[i]}") in said, said
            assert "Traceback" not in said
        procs = _start(hosts, tmp_path, [*BASE, "trainer.steps=5", *_elastic(hosts, 29403)],
                       own=lambda i: [f"cluster.local_addr={hosts.addrs[i]}"])
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, out[-4000:] + err[-3000:]


def test_an_elastic_job_goes_on_without_a_cut_off_host_which_leaves(tmp_path):
    """nnodes=1:2: the store's host names the other lost (the liveness check, not the watchdog), meets the
    rendezvous again alone and finishes from the newest checkpoint; the cut-off host says it lost the store, exits."""
    shared = tmp_path / "shared"
    args = [*BASE, "trainer.steps=60", "trainer.checkpoint_every=10", f"trainer.checkpoint_dir={shared}",
            "launcher.max_restarts=1", "+cluster.rdzv_conf.last_call_timeout=2",
            "+cluster.rdzv_conf.keep_alive_interval=1", "+cluster.rdzv_conf.keep_alive_max_attempt=3"]
    with Hosts(2) as hosts:
        elastic = [a.replace("cluster.nnodes=2", "cluster.nnodes=1:2") for a in _elastic(hosts, 29404)]
        procs = _start(hosts, tmp_path, [*args, *elastic])
        run0 = tmp_path / "h0" / "log_output" / "latest"
        _run_until(procs, run0, 22)
        hosts.cut(1)
        cut = time.monotonic()
        out1, err1 = procs[1].communicate(timeout=HEARTBEAT_S + 60)
        took = time.monotonic() - cut
        out0, err0 = procs[0].communicate(timeout=300)
    assert procs[1].returncode == 1 and took <= HEARTBEAT_S + 15, (procs[1].returncode, took, out1[-3000:])
    assert "is cut off from host h0" in " ".join((out1 + err1).split())
    assert procs[0].returncode == 0, out0[-4000:] + err0[-3000:]
    summary = json.loads((run0.resolve() / "summary.json").read_text())
    first, second = summary["attempts"]
    assert first["status"] == "failed" and "hung_ranks" not in first  # named lost, not a hang
    assert [h["hostname"] for h in first["lost_hosts"]] == ["h1"]
    assert summary["attempts"][1]["resumed_step"] in (10, 20) and second["status"] == "ok"
    assert second["left"] and second["left"][0].startswith("h1 (launcher h1:")
    said = " ".join(out0.replace("│", " ").split())
    assert "host h1 (node 1, ranks 1) has not been heard from for" in said, said[-3000:]


def test_a_slow_link_trains_with_no_false_lost_host(tmp_path):
    """20 Mbit/s and 50 ms between the hosts (netem); where the kernel has no netem, 20 Mbit/s alone (tbf)."""
    with Hosts(2) as hosts:
        if not hosts.can_shape("netem"):
            for i in range(2):
                hosts.shape(i, "rate", "20mbit", "delay", "25ms")  # 50 ms between the hosts
        elif why := hosts.can_shape("tbf"):
            pytest.skip(why)
        else:
            for i in range(2):
                hosts.limit(i, "20mbit")
        procs = _start(hosts, tmp_path, [*BASE, "trainer.steps=15", *_elastic(hosts, 29405)])
        outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-4000:] + err[-3000:]


def test_an_endpoint_nothing_answers_is_one_paragraph_and_a_summary(tmp_path):
    """The rendezvous' address has no host behind it (a typo, a host not up): torch's handler fails; the launcher
    says so in one paragraph, exits 1, and leaves a run dir whose summary says why (it was a raw traceback)."""
    with Hosts(1) as hosts:
        nobody = f"{hosts.net}.99:29406"
        (proc,) = _start(hosts, tmp_path, [*BASE, "trainer.steps=5", "cluster.launch=elastic", "cluster.nnodes=2",
                                           f"cluster.rdzv_endpoint={nobody}", f"cluster.local_addr={hosts.addrs[0]}",
                                           "cluster.rdzv_timeout_s=10", "+cluster.rdzv_conf.read_timeout=3"])
        out, err = proc.communicate(timeout=120)
    said = " ".join(out.split())
    assert proc.returncode == 1 and "Traceback" not in out + err, out[-3000:] + err[-3000:]
    assert f"the rendezvous at cluster.rdzv_endpoint={nobody} cannot be reached: RendezvousConnectionError" in said
    summary = json.loads(((tmp_path / "h0" / "log_output" / "latest") / "summary.json").read_text())
    assert summary["status"] == "failed" and "cannot be reached" in summary["error"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (Debian: apt-get install openmpi-bin)")
def test_mpirun_across_two_hosts_equals_one_host(tmp_path):
    """cluster.launch=mpi with a hostfile of two namespaced hosts: one launcher (on h0) runs mpirun, which starts its
    daemon on h1 through a remote shell (tests/hosts.py rsh_agent, in ssh's place); rank 1 runs on h1, the ranks
    meet at the launcher's store on h0's address, and the losses equal one host's 2 ranks."""
    with Hosts(2) as hosts:
        (tmp_path / "hostfile").write_text("h0 slots=1\nh1 slots=1\n")
        mpi = ["cluster.launch=mpi", "cluster.nnodes=2", "cluster.nproc_per_node=1", "cluster.master_addr=h0",
               f"cluster.hostfile={tmp_path / 'hostfile'}",
               f"cluster.launcher_args=[--mca,plm_rsh_agent,{hosts.rsh_agent()}]"]
        proc = hosts.run(0, [sys.executable, "-m", "launcher.cli", *BASE, "trainer.steps=8", *mpi],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "COLUMNS": "200"})
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    run = (tmp_path / "log_output" / "latest").resolve()
    assert [(run / f"rank.{r}" / "pid").read_text().split()[0] for r in (0, 1)] == ["h0", "h1"]
    env = json.loads((run / "rank_env.json").read_text())
    assert {e["MASTER_ADDR"] for e in env.values()} == {"h0"}
    ref = tmp_path / "ref"
    ref.mkdir()
    res = run_cli([*BASE, "trainer.steps=8", "cluster.nproc_per_node=2"], ref)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_close(losses(ref / "log_output" / "latest"), losses(run), rel=1e-6)
