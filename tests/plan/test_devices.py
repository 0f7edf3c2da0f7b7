"""A rank table's device_ids and a hostfile's included slots become each host's CUDA_VISIBLE_DEVICES, as DeepSpeed's
launcher maps its --include slots (local rank i uses cuda:i, the i-th listed device)."""

from launcher.backends import backend
from launcher.plan.hostfile import filter_hosts, hostfile_layout
from launcher.plan.ranks import plan_ranks, visible_devices

POOL = [("worker-0", 4), ("worker-1", 4)]


def _layout(include: str):
    return hostfile_layout(filter_hosts(POOL, include, "", source="h"), "cluster.hostfile=h")


def test_included_slots_are_each_hosts_visible_devices():
    problems: list[str] = []
    assert visible_devices(_layout("worker-0:2,3@worker-1:2,3"), "cuda", backend("elastic"), problems) == ("2,3", "2,3")
    assert visible_devices(_layout("worker-0:0,1@worker-1:2,3"), "cuda", backend("mpi"), problems) == ("0,1", "2,3")
    assert problems == []


def test_the_first_devices_or_cpu_ranks_leave_the_variable_alone():
    problems: list[str] = []
    assert visible_devices(_layout("worker-0:0,1@worker-1:0,1"), "cuda", backend("mpi"), problems) == ()
    assert visible_devices(_layout("worker-0:2,3@worker-1:2,3"), "cpu", backend("mpi"), problems) == ()
    assert visible_devices(None, "cuda", backend("mpi"), problems) == () and problems == []


def test_different_devices_per_host_need_the_files_host_order():
    problems: list[str] = []
    visible_devices(_layout("worker-0:0,1@worker-1:2,3"), "cuda", backend("elastic"), problems)
    (problem,) = problems
    assert "worker-0: 0,1; worker-1: 2,3" in problem and "cluster.launch=mpi" in problem


def test_each_rank_gets_its_hosts_devices():
    ranks = plan_ranks(nnodes=2, nproc_per_node=2, device_type="cuda", master_addr="h", master_port=0, cpu_count=8,
                       extensions_dir="/x", devices=("0,1", "2,3"))
    assert [(r.rank, r.device, r.env["CUDA_VISIBLE_DEVICES"]) for r in ranks] == [
        (0, "cuda:0", "0,1"), (1, "cuda:1", "0,1"), (2, "cuda:0", "2,3"), (3, "cuda:1", "2,3")]
