"""The schema's sections for where and how the ranks are started, watched and recorded: ``cluster``, ``output``,
``launcher`` and ``debug`` (part of the typed config in launcher/schema.py, which nests them in HeteroConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ClusterConfig:
    launch: str = "local"
    """How ranks are started: local (this host's ranks, the launcher hosts the rendezvous store); elastic (several
    hosts: run the same command on each; they meet on torch elastic's c10d rendezvous at cluster.rdzv_endpoint and
    get their node ranks there, as with torchrun --rdzv-backend=c10d); mpi (one launcher runs the ranks under
    OpenMPI's mpirun, on the hosts of cluster.hostfile); slurm (inside an allocation: the ranks run under srun; a dry
    run writes job.sbatch for sbatch)."""
    launcher_args: list[str] = field(default_factory=list)
    """cluster.launch=mpi|slurm: extra arguments for mpirun or srun, one list item each (never through a shell),
    e.g. [--mca,btl_tcp_if_include,eth0]."""
    nnodes: Any = 1
    """Number of hosts; more than 1 needs cluster.launch=elastic, mpi (with cluster.hostfile) or slurm. With
    cluster.launch=elastic also MIN:MAX (torchrun's --nnodes=MIN:MAX): the job runs on MIN to MAX hosts, planned for
    MAX; with launcher.max_restarts > 0 it restarts on the hosts left when one is lost, and admits a host that joins
    later, planning again for each world (global batch kept) from the newest checkpoint."""
    node_rank: int = 0
    """This host's index among nnodes (local: 0; elastic: assigned at the rendezvous, this key is not used)."""
    rdzv_endpoint: str = ""
    """cluster.launch=elastic: host:port of the rendezvous: with c10d, the same on every host (a host that is one of
    the nodes; the first node there to start hosts it); with etcd-v2, an etcd member's client address."""
    rdzv_backend: str = "c10d"
    """cluster.launch=elastic: torch's rendezvous backend, as torchrun's --rdzv-backend: c10d (the store lives in the
    launcher of the endpoint's host: losing that host ends the job) or etcd-v2 (an etcd server with the v2 API,
    etcd --enable-v2, and the python-etcd package: with an etcd member on each host and each host's endpoint its own
    member, e.g. 127.0.0.1:2379, any one host of three may be lost)."""
    rdzv_id: str = "hetero-launch"
    """cluster.launch=elastic: the rendezvous' name, the same on every host of one job (two jobs on one endpoint
    need two ids)."""
    rdzv_conf: dict[str, int] = field(default_factory=dict)
    """cluster.launch=elastic: torch's rendezvous settings, as torchrun's --rdzv-conf: last_call_timeout (s a
    round waits for more hosts once MIN are there; torch's default 30), keep_alive_interval (s between a launcher's
    heartbeats; 5), keep_alive_max_attempt (missed heartbeats before a host counts as lost; 3), close_timeout (30),
    read_timeout (s a store call may take; 60).
    Empty = torch's defaults."""
    rdzv_timeout_s: float = 300.0
    """cluster.launch=elastic: how long the hosts wait for every node to join; then the run stops, saying who came.
    Below 60 it also bounds the wait for the endpoint to answer (torch's rdzv_conf read_timeout, unless set)."""
    heartbeat_timeout_s: float = 30.0
    """cluster.launch=elastic: a host whose launcher has not been heard from for this long is lost: every other host
    names it (host name, address, ranks) and stops its ranks; a host that the rendezvous store has not answered for
    this long is cut off and leaves the job. The launchers beat six times within it (at most every 5 s)."""
    local_addr: str = ""
    """cluster.launch=elastic: this host's address as the other hosts reach it; empty = its fully qualified name (a
    job of several hosts whose name resolves to a loopback address is refused before launch). When it is the host of
    cluster.rdzv_endpoint, this host's launcher holds the rendezvous store."""
    nproc_per_node: str = "auto"
    """Ranks on this host: a positive integer, or auto = one per visible accelerator, 2 on a CPU-only host."""
    master_addr: str = "127.0.0.1"
    """Address of the rendezvous store (rank 0's host)."""
    master_port: int = 0
    """Port of the rendezvous store; 0 = a free port picked at launch."""
    device_memory_gb: float = 0.0
    """Memory of one accelerator in GB (10^9 bytes); 0 = what the host reports (on a CPU-only host the ranks' share
    of host memory: there the device is host memory)."""
    host_memory_gb: float = 0.0
    """Memory of one host in GB (10^9 bytes), shared by its ranks and the launcher; 0 = what the host reports (its
    RAM, or the container's cgroup limit when lower)."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl with accelerators, else gloo), gloo or nccl."""
    device: str = "auto"
    """Where ranks compute: auto (cuda with visible CUDA devices, else cpu), cpu (also on a GPU host), or cuda."""
    # A cluster described in a file (read in launcher/facts/cluster_files.py); give at most one.
    rank_table_file: str = ""
    """A MindSpore/HCCL rank table (JSON, version 1.0, as hccl_tools.py writes it): servers, devices, rank ids.
    Empty = none."""
    hostfile: str = ""
    """A DeepSpeed-style hostfile: one `<host> slots=<N>` line per host, # comments. Empty = none."""
    include: str = ""
    """With hostfile: only these hosts/slots, DeepSpeed's --include syntax (worker-0@worker-1:0,2). Empty = all."""
    exclude: str = ""
    """With hostfile: all but these hosts/slots, DeepSpeed's --exclude syntax (worker-1:0). Empty = none excluded;
    not together with include."""


@dataclass
class OutputConfig:
    log_dir: str = "log_output"
    """Where run dirs go, relative to the directory the command runs in."""
    run_name: str = ""
    """Run dir name; empty = <recipe>-<YYYYmmdd-HHMMSS>. An existing run dir is never overwritten."""
    stderr_tail: int = 20
    """Lines of a failed rank's stderr printed by the launcher."""
    console: str = "rank0"
    """A script= run's output on the launcher's terminal as it runs (torchrun's --tee): rank0 = rank 0's stdout and
    stderr lines, all = every rank's, each line prefixed [rank N], none = nothing. Either way every rank's output is
    written in full to rank.N/{stdout,stderr}; a line over 4 KiB is cut on the terminal with a marker. A recipe's
    ranks report through the progress view and the failure report instead: their output stays in rank.N/."""
    full_plan: bool = False
    """The plan a dry run and the start of a run print: false = compact (world and mesh, the parts, batch, trainer,
    optimizer, one line per table, memory per rank and per host against the budgets, every note on one line cut with
    …: about 40 lines at 100 columns); true = the whole tree and every table. Either way the run dir's plan.txt has
    the whole plan."""


@dataclass
class LauncherConfig:
    watchdog_s: float = 300.0
    """A rank whose heartbeat (finished steps, evaluation batches) has not moved for this long, or for 10 of its
    slowest steps if that is longer, is stalled: the launcher names it, has every rank print its Python stacks,
    and stops the job (status hung). A checkpoint save keeps the heartbeat moving and may take up to 12 times this
    limit. A recipe's rank may take 12 times this limit to its first finished step (model build, first data,
compilation), counted from the job's start; a script's rank is watched from its first heartbeat. 0 = no watchdog."""
    max_restarts: int = 0
    """After a failed attempt, start the job again this many times at most, from the run's newest complete
    checkpoint (each attempt's rank logs are kept in attempt.<k>/). Not after an interrupt or bad input."""
    warm_start: bool = True
    """A recipe's ranks on CPU are forked from a forkserver that imported torch and the worker once for the launcher's
    runs (a sweep's jobs, an elastic restart), instead of each importing them anew (~4 s of CPU a rank on 2 cores: a
    2-rank run takes 0.64-0.71× the CPU, 4 ranks 0.40×, bench/warm_start.py); each rank still gets its own
    variables, session, output files and death with the launcher. false = every rank a fresh
    ``python -m launcher.worker`` (as for scripts and CUDA plans, which always start so)."""
    malloc: str = "auto"
    """The ranks' memory allocator. auto: for a recipe's ranks tcmalloc where it is installed (libtcmalloc-minimal4),
    preloaded as torch's CPU launcher (torch.backends.xeon.run_cpu) does, else glibc's; a script's ranks keep glibc's.
    tcmalloc: refused where it is not installed; glibc: glibc's malloc (a recipe's set to keep a step's freed memory,
    launcher/worker/heap.py). Your own LD_PRELOAD of an allocator, or glibc's MALLOC_* / GLIBC_TUNABLES variables,
    are kept (docs/running.md#malloc)."""


@dataclass
class DebugConfig:
    fail_rank: int = -1
    """Fault injection for testing supervision: this rank raises ... (in the first attempt only); -1 = off."""
    fail_step: int = -1
    """... once this step is done and logged."""
