"""Several hosts (cluster.launch=elastic): the plan numbers ranks node by node; its keys are checked before anything
starts, each problem naming its key."""

import pytest

from launcher.errors import ConfigError
from launcher.launch.nodes import plan_hash
from tests.conftest import plan_of

ELASTIC = ["recipe=quickstart", "cluster.launch=elastic", "cluster.nnodes=2", "cluster.nproc_per_node=2",
           "cluster.rdzv_endpoint=node0.cluster:29400"]


def test_two_nodes_of_two_ranks_are_one_world_of_four(cpu_host):
    plan = plan_of(ELASTIC, cpu_host)
    assert plan.world_size == 4 and plan.nnodes == 2 and plan.dims.dp == 4
    assert [(r.rank, r.node_rank, r.local_rank) for r in plan.ranks] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert {r.env["GROUP_WORLD_SIZE"] for r in plan.ranks} == {"2"} and plan.ranks[3].env["GROUP_RANK"] == "1"
    # What the nodes compare: the same config plans the same on any host; another config does not.
    other_host = type(cpu_host)(hostname="b", cpu_count=64, accelerators=0, extensions_dir="/elsewhere")
    assert plan_hash(plan) == plan_hash(plan_of(ELASTIC, other_host))
    assert plan_hash(plan) != plan_hash(plan_of([*ELASTIC, "trainer.steps=7"], cpu_host))


def test_a_loopback_c10d_endpoint_is_said_in_the_plan(cpu_host):
    """Right for launchers on one host (the tests run them so), a dead end for a host elsewhere (it waited
    rdzv_timeout_s): said, not refused; an etcd-v2 endpoint on loopback is each host's own member (no note)."""
    loopback = [n for n in plan_of([*ELASTIC, "cluster.rdzv_endpoint=127.0.0.1:29400"], cpu_host).notes
                if "loopback" in n]
    assert loopback == ["cluster.rdzv_endpoint=127.0.0.1:29400 is a loopback address: only launchers on this host "
                        "reach it (one on another host would wait cluster.rdzv_timeout_s=300 s and stop); give the "
                        "store host's address as the other hosts reach it for a job of several hosts"]
    assert not [n for n in plan_of(ELASTIC, cpu_host).notes if "loopback" in n]


@pytest.mark.parametrize("overrides, message", [
    (["cluster.nnodes=2"], "cluster.nnodes=2 with cluster.launch=local: a local launch starts this host's ranks"),
    (["cluster.launch=mpi", "cluster.nnodes=2"], "cluster.launch=mpi with cluster.nnodes=2: mpirun needs the hosts"),
    (["cluster.launch=mpi", "cluster.node_rank=1"], "cluster.node_rank=1: only cluster.launch=elastic"),
    (["cluster.launch=pbs"], "cluster.launch=pbs is not one of local, elastic, mpi, slurm"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint=node0"], "cluster.rdzv_endpoint=node0 must be <host>:<port>"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint='a;rm -rf /:29400'"], "must be <host>:<port>"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint='$(id):29400'"], "must be <host>:<port>"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint=h:0"], "must be <host>:<port>"),
    ([*ELASTIC[1:], "cluster.local_addr='10.0.0.1 x'"], "cluster.local_addr=10.0.0.1 x must be a host name"),
    ([*ELASTIC[1:], "cluster.rdzv_id=a/b"], "cluster.rdzv_id=a/b must be a name"),
    ([*ELASTIC[1:], "cluster.rdzv_backend=etcd"], "cluster.rdzv_backend=etcd is not a rendezvous backend the launcher "
                                                  "runs: use c10d or etcd-v2"),
    (["cluster.rdzv_backend=etcd-v2"], "cluster.rdzv_backend=etcd-v2 is read by cluster.launch=elastic only"),
    ([*ELASTIC[1:], "cluster.rdzv_timeout_s=0"], "cluster.rdzv_timeout_s=0"),
    ([ELASTIC[1], *ELASTIC[3:], "cluster.nnodes=2:1"], r"cluster.nnodes=2:1: MIN 2 is above MAX 1. Set cluster.nnodes=1:2"),
    ([ELASTIC[1], *ELASTIC[3:], "cluster.nnodes=0:2"], r"cluster.nnodes=0:2 must be 1 or more"),
    ([ELASTIC[1], *ELASTIC[3:], "cluster.nnodes=two"], r"cluster.nnodes=two must be a number of hosts"),
    (["recipe=quickstart", "cluster.nnodes=1:2"], r"cluster.nnodes=1:2: a range of hosts needs cluster.launch=elastic"),
    ([*ELASTIC[1:], "+cluster.rdzv_conf.last_call=2"], r"cluster.rdzv_conf.last_call is not a setting"),
    ([*ELASTIC[1:], "+cluster.rdzv_conf.keep_alive_interval=0"], r"cluster.rdzv_conf.keep_alive_interval=0 must be"),
    # restarts on several hosts: every rank's shards where every host reads them, and checkpoints at all
    ([*ELASTIC[1:], "launcher.max_restarts=1"], "launcher.max_restarts=1 with cluster.launch=elastic on "
                                                "cluster.nnodes=2 hosts: a restart resumes from every rank's"),
    ([*ELASTIC[1:], "launcher.max_restarts=1", "trainer.checkpoint_dir=/shared/ck", "trainer.checkpoint_every=-1"],
     "launcher.max_restarts=1 with trainer.checkpoint_every=-1: a restart could only start over"),
    # a key only another backend reads would change nothing: refused, naming the backend that reads it
    (["cluster.rdzv_endpoint=node0:29400"], "cluster.rdzv_endpoint=node0:29400 is read by cluster.launch=elastic "
                                            "only; with cluster.launch=local it would change nothing"),
    (["cluster.launch=mpi", "+cluster.rdzv_conf.last_call_timeout=5"], "cluster.rdzv_conf={'last_call_timeout': 5} "
                                                                       "is read by cluster.launch=elastic only"),
    ([*ELASTIC[1:], "cluster.launcher_args=[-x]"], "cluster.launcher_args=['-x'] is read by cluster.launch=mpi / "
                                                   "slurm only; with cluster.launch=elastic"),
])
def test_bad_cluster_keys_are_named(cpu_host, overrides, message):
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=quickstart", *overrides], cpu_host)
    assert message in e.value.render()


def _table(servers):
    return {"version": "1.0", "server_count": str(len(servers)), "status": "completed", "server_list": [
        {"server_id": host, "host_nic_ip": "reserve", "device": [
            {"device_id": str(d), "device_ip": f"192.1.{n}.{d}", "rank_id": str(r)} for d, r in enumerate(ranks)]}
        for n, (host, ranks) in enumerate(servers)]}


def test_a_rank_table_sets_the_nodes_and_a_bad_one_exits_2_naming_the_entry(tmp_path, capsys):
    import json

    from launcher.cli import main

    good, bad = tmp_path / "hccl_4p.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_table([("10.0.0.1", [0, 1]), ("10.0.0.2", [2, 3])])))
    bad.write_text(json.dumps(_table([("10.0.0.1", [0, 1]), ("10.0.0.2;reboot", [1, 3])])))
    log_dir = f"output.log_dir={tmp_path / 'logs'}"
    assert main(["recipe=quickstart", f"cluster.rank_table_file={good}", "cluster.launch=elastic", "dry_run=true",
                 log_dir]) == 0
    plan = json.loads(next((tmp_path / "logs").glob("quickstart-*/plan.json")).read_text())
    assert plan["world_size"] == 4 and [r["node_rank"] for r in plan["ranks"]] == [0, 0, 1, 1]
    capsys.readouterr()
    assert main(["recipe=quickstart", f"cluster.rank_table_file={bad}", "cluster.launch=elastic", log_dir]) == 2
    err = capsys.readouterr().err
    assert 'server_list[1].server_id="10.0.0.2;reboot"' in err and 'server_list[1].device[0].rank_id="1"' in err


def test_a_host_with_less_memory_than_the_plan_puts_on_it_is_named(cpu_host):
    from launcher.launch.nodes import memory_problems

    plan = plan_of(["recipe=wide_deep", "cluster.launch=elastic", "cluster.nnodes=2", "cluster.nproc_per_node=2",
                    "cluster.rdzv_endpoint=node0:29400"], cpu_host)
    per_host = 2 * (plan.memory.host.total + plan.memory.device.total)
    hosts = [{"node": 0, "hostname": "a", "mem_available": 64 * 2**30},
             {"node": 1, "hostname": "b", "mem_available": per_host - 1}]
    assert memory_problems(plan, hosts[:1]) == []
    (problem,) = memory_problems(plan, hosts)
    assert problem.startswith("cluster.nproc_per_node=2: the plan puts") and "node 1 (b)" in problem
    assert "node 0" not in problem


def test_a_range_of_hosts_plans_for_max_and_restarts_are_accepted(cpu_host):
    """cluster.nnodes=MIN:MAX (torchrun's spelling) plans the world of MAX hosts; restarts are the elastic agent's."""
    given = [o for o in ELASTIC[1:] if not o.startswith("cluster.nnodes=")]
    plan = plan_of(["recipe=quickstart", *given, "cluster.nnodes=1:2", "launcher.max_restarts=2",
                    "trainer.checkpoint_dir=/shared/ck"], cpu_host)
    assert plan.nnodes == 2 and plan.world_size == 4
