"""Rank layout: the rank table (MindSpore/HCCL JSON form) and each rank's environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.contract import BackendRules
from launcher.plan.layout import ClusterLayout
from launcher.plan.parallel import ParallelDims


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_rank: int
    node_rank: int
    device: str
    """torch device string: cpu, or cuda:<local_rank>."""
    coords: dict[str, int] = field(default_factory=dict)
    """Coordinates in the parallel mesh ({pp, dp, tp}); empty for a script run."""
    env: dict[str, str] = field(default_factory=dict)
    """The variables this rank is started with (on top of the launcher's environment)."""


def plan_ranks(
    *,
    nnodes: int,
    nproc_per_node: int,
    device_type: str,
    master_addr: str,
    master_port: int,
    cpu_count: int,
    extensions_dir: str,
    dims: ParallelDims | None = None,
    devices: tuple[str, ...] = (),
    path: str = "",
    omp_threads: str = "",
) -> tuple[RankPlan, ...]:
    """One RankPlan per global rank. MASTER_PORT "0" means: picked at launch. OMP_NUM_THREADS shares the host's
    cores among its local ranks. ``devices[n]``: node n's CUDA_VISIBLE_DEVICES (its ranks' devices in local-rank
    order, so local rank i uses cuda:i = the i-th of them); () = leave CUDA_VISIBLE_DEVICES as the host has it.
    ``path``: the ranks' PATH, the one the launcher pre-builds DeepSpeed's ops with (HostFacts.toolchain_path), so
    a rank's JIT load finds the same ninja and compiler and has nothing to rebuild; "" = the launcher's PATH.
    ``omp_threads``: the OMP_NUM_THREADS the user set (HostFacts.omp_threads, checked by omp_threads_kept), which
    every rank keeps as torchrun keeps it; "" = the host's cores shared."""
    world = nnodes * nproc_per_node
    omp_threads = omp_threads or max(1, cpu_count // nproc_per_node)
    ranks = []
    for node in range(nnodes):
        for local in range(nproc_per_node):
            rank = node * nproc_per_node + local
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(local),
                "GROUP_RANK": str(node),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nproc_per_node),
                "GROUP_WORLD_SIZE": str(nnodes),
                "ROLE_RANK": str(rank),
                "ROLE_NAME": "default",
                "ROLE_WORLD_SIZE": str(world),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "OMP_NUM_THREADS": str(omp_threads),
                "TORCH_EXTENSIONS_DIR": extensions_dir,
                "PYTHONUNBUFFERED": "1",
            }
            if path:
                env["PATH"] = path
            if device_type == "cpu":
                env["DS_ACCELERATOR"] = "cpu"
                env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks on a GPU host (cluster.device=cpu) see no GPU
            elif devices:
                env["CUDA_VISIBLE_DEVICES"] = devices[node]
            device = "cpu" if device_type == "cpu" else f"cuda:{local}"
            coords = dims.coords(rank) if dims is not None else {}
            ranks.append(RankPlan(rank=rank, local_rank=local, node_rank=node, device=device, coords=coords, env=env))
    return tuple(ranks)


def omp_threads_kept(value: str, cpu_count: int, nproc_per_node: int) -> tuple[list[str], list[str]]:
    """(problems, notes) of the launcher's own OMP_NUM_THREADS: torch.distributed.run sets 1 only where the user
    set none, and keeps a value the user set; so do the ranks here, and the plan says so."""
    if not value:
        return [], []
    shared = max(1, cpu_count // nproc_per_node)
    if not (value.isascii() and value.isdigit() and int(value) >= 1):
        return [f"OMP_NUM_THREADS={value!r} in the launcher's environment: each rank keeps the OMP_NUM_THREADS you "
                f"set (as torchrun does), and it must be a whole number of threads >= 1. Set it "
                f"(export OMP_NUM_THREADS={shared}), or unset it for the plan's share of this host's {cpu_count} "
                f"core(s) among {nproc_per_node} rank(s) ({shared} each)."], []
    return [], [f"OMP_NUM_THREADS={value} from your environment: kept in every rank, as torchrun keeps a value you "
                f"set (unset, each rank would get {shared}: {cpu_count} core(s) / {nproc_per_node} rank(s))"]


def visible_devices(layout: ClusterLayout | None, device_type: str, launch: BackendRules | None,
                    problems: list[str]) -> tuple[str, ...]:
    """Each node's CUDA_VISIBLE_DEVICES from the device ids a rank table (device_id) or a hostfile's slots
    (include/exclude, as DeepSpeed's launcher maps them) give its ranks; () without a layout, on CPU, or when every
    host's are its first nproc_per_node devices (a scheduler's own CUDA_VISIBLE_DEVICES is then left alone). With
    cluster.launch=elastic the rendezvous, not the file, orders the nodes: per-host lists that differ are a problem
    (appended to problems) there."""
    if layout is None or device_type != "cuda":
        return ()
    per_node = tuple(",".join(str(s.device_id) for s in sorted(layout.ranks, key=lambda s: s.local_rank)
                              if s.node_rank == node) for node in range(layout.nnodes))
    first = ",".join(str(i) for i in range(layout.nproc_per_node))
    if all(d == first for d in per_node):
        return ()  # the first N devices on every host: what the ranks use anyway (and Slurm's own mapping stays)
    if launch is not None and launch.launcher_per_host and len(set(per_node)) > 1:
        listed = "; ".join(f"{h}: {d}" for h, d in zip(layout.hosts, per_node))
        problems.append(f"{layout.source} gives the hosts different devices ({listed}), and with "
                        f"cluster.launch=elastic the rendezvous, not the file, decides which host is which node. Use "
                        f"the same devices on every host, or cluster.launch=mpi (the file's host order).")
    return per_node


def on_node(ranks: tuple[RankPlan, ...], node: int) -> tuple[RankPlan, ...]:
    """The ranks node ``node`` starts (its local ranks, in order)."""
    return tuple(r for r in ranks if r.node_rank == node)


def rank_table(ranks: tuple[RankPlan, ...], hosts: list[str]) -> dict:
    """The rank table in MindSpore/HCCL form (all values strings, as HCCL writes them).

    ``hosts[n]`` is node n's address. On a CPU-only host each rank's "device" is a CPU process; its device_ip is
    the host's address."""
    servers = []
    for node, host in enumerate(hosts):
        devices = [{"device_id": str(r.local_rank), "device_ip": host, "rank_id": str(r.rank)}
                   for r in on_node(ranks, node)]
        servers.append({"server_id": host, "device": devices, "host_nic_ip": "reserve"})
    return {"version": "1.0", "server_count": str(len(hosts)), "server_list": servers, "status": "completed"}
