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


@pytest.mark.parametrize("overrides, message", [
    (["cluster.nnodes=2"], "cluster.nnodes=2 with cluster.launch=local: a local launch starts this host's ranks"),
    (["cluster.launch=mpi"], "cluster.launch=mpi is not supported yet (planned: mpirun)"),
    (["cluster.launch=pbs"], "cluster.launch=pbs is not one of local, elastic"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint=node0"], "cluster.rdzv_endpoint=node0 must be <host>:<port>"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint='a;rm -rf /:29400'"], "must be <host>:<port>"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint='$(id):29400'"], "must be <host>:<port>"),
    ([*ELASTIC[1:3], "cluster.rdzv_endpoint=h:0"], "must be <host>:<port>"),
    ([*ELASTIC[1:], "cluster.local_addr='10.0.0.1 x'"], "cluster.local_addr=10.0.0.1 x must be a host name"),
    ([*ELASTIC[1:], "cluster.rdzv_id=a/b"], "cluster.rdzv_id=a/b must be a name"),
    ([*ELASTIC[1:], "cluster.rdzv_timeout_s=0"], "cluster.rdzv_timeout_s=0"),
    ([*ELASTIC[1:], "launcher.max_restarts=1"], "restarts across hosts are not supported yet"),
])
def test_bad_cluster_keys_are_named(cpu_host, overrides, message):
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=quickstart", *overrides], cpu_host)
    assert message in e.value.render()
