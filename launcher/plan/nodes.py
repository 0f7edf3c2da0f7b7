"""cluster.nnodes: a number of hosts, or MIN:MAX (torchrun's ``--nnodes`` spelling) for an elastic job that runs on
any number of hosts in that range and restarts on a new one when a host is lost or joins.

The plan is made for MAX hosts (what a dry run shows); an elastic launcher plans again for the hosts each rendezvous
round brings (``launcher.launch.elastic_agent``). Pure: no I/O."""

from __future__ import annotations

import re

from omegaconf import DictConfig

from launcher.contract import BackendRules, backend_named
from launcher.plan.layout import endpoint_host

__all__ = ["checkpoint_problems", "node_range", "node_range_problems", "planned_nodes", "store_notes"]

_RANGE = re.compile(r"\s*(-?\d+)\s*:\s*(-?\d+)\s*")


def node_range(value) -> tuple[int, int] | None:
    """(MIN, MAX) of cluster.nnodes: N is N:N; None when the value is neither an integer nor MIN:MAX of integers
    (the range itself is checked by node_range_problems)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value, value
    m = _RANGE.fullmatch(str(value))
    if m:
        return int(m.group(1)), int(m.group(2))
    s = str(value).strip()
    return (int(s), int(s)) if re.fullmatch(r"-?\d+", s) else None


def node_range_problems(value, launch: str, ranged: bool) -> list[str]:
    """What is wrong with cluster.nnodes: not N or MIN:MAX, MIN below 1, MIN above MAX, or a range on a backend
    that runs a fixed number of hosts (``ranged``: the backend's launchers meet at a rendezvous every round, which
    takes the hosts that are there)."""
    got = node_range(value)
    if got is None:
        return [f"cluster.nnodes={value} must be a number of hosts (cluster.nnodes=2) or, with cluster.launch=elastic, "
                f"MIN:MAX (cluster.nnodes=1:2: the job runs on 1 to 2 hosts and restarts when one is lost or joins)."]
    lo, hi = got
    if lo < 1:
        return [f"cluster.nnodes={value} must be 1 or more (the number of hosts). Set cluster.nnodes=1 for this host "
                f"alone{', or MIN:MAX with MIN >= 1' if lo != hi else ''}."]
    if lo > hi:
        return [f"cluster.nnodes={value}: MIN {lo} is above MAX {hi}. Set cluster.nnodes={hi}:{lo}."]
    if lo != hi and not ranged:
        return [f"cluster.nnodes={value}: a range of hosts needs cluster.launch=elastic (one launcher per host, meeting "
                f"at cluster.rdzv_endpoint); cluster.launch={launch} runs a fixed number. Set cluster.nnodes={hi} or "
                f"cluster.launch=elastic."]
    return []


def checkpoint_problems(cfg: DictConfig) -> list[str]:
    """Restarts of a job whose launchers meet every round (elastic) resume from every rank's shards: on several
    hosts they must be where every host reads them, and there must be checkpoints at all."""
    got = node_range(cfg.cluster.nnodes)
    restarts = cfg.launcher.max_restarts
    if restarts > 0 and got is not None and got[1] > 1 and not cfg.trainer.checkpoint_dir:
        return [f"launcher.max_restarts={restarts} with cluster.launch={cfg.cluster.launch} on "
                f"cluster.nnodes={cfg.cluster.nnodes} hosts: a restart resumes from every rank's checkpoint shards, a "
                f"lost host's too, so the checkpoints must be on a file system every host reads and writes. Set "
                f"trainer.checkpoint_dir=<a shared folder for this job> (the same on every host)."]
    if restarts > 0 and cfg.trainer.checkpoint_every < 0:
        return [f"launcher.max_restarts={restarts} with trainer.checkpoint_every=-1: a restart could only start "
                f"over. Set trainer.checkpoint_every=<N steps>."]
    return []


def store_notes(cfg: DictConfig, backends: tuple[BackendRules, ...]) -> list[str]:
    """A job of several hosts that meet at a rendezvous (cluster.launch=elastic): where its store is, and which host
    it cannot lose."""
    chosen = backend_named(backends, cfg.cluster.launch)
    got = node_range(cfg.cluster.nnodes)
    if chosen is None or not chosen.launcher_per_host or got is None or got[1] < 2:
        return []
    c = cfg.cluster
    lost = f"(named after cluster.heartbeat_timeout_s={c.heartbeat_timeout_s:g} s)"
    rdzv = chosen.rdzv_backends.get(str(c.rdzv_backend))  # None: a name the rules refuse
    etcd = rdzv is not None and rdzv.etcd
    where = (f"cluster.rdzv_endpoint={c.rdzv_endpoint}: the rendezvous store is the etcd server there (torch's "
             f"etcd-v2 backend): no launcher holds it, so with an etcd member on each host (a cluster that keeps its "
             f"quorum) any host may be lost {lost}; keep that timeout above etcd's request timeout and leader "
             f"election (~7 s with etcd's defaults: a call waits that long when the leader's host is lost); a job's "
             f"keys stay in etcd after it: give each job its own cluster.rdzv_id" if etcd else
             f"cluster.rdzv_endpoint={c.rdzv_endpoint}: the rendezvous store lives in the launcher on that host "
             f"(torch's c10d backend), so losing that host ends the job whatever cluster.nnodes allows; any other "
             f"host may be lost {lost}; cluster.rdzv_backend=etcd-v2 has no such host")
    loopback = [] if etcd else _loopback(c.rdzv_endpoint, c.rdzv_timeout_s)  # etcd: each host's own member
    return [where, *loopback,
            f"cluster.rdzv_id={c.rdzv_id}: the hosts of this job meet under that name, waiting "
            f"cluster.rdzv_timeout_s={c.rdzv_timeout_s:g} s for all of them; this host is reached at "
            f"cluster.local_addr={c.local_addr or '(its fully qualified name)'}; torch's {c.rdzv_backend} rendezvous "
            f"with cluster.rdzv_conf={dict(c.rdzv_conf) or '(its defaults)'}"]


def _loopback(endpoint: str, timeout_s: float) -> list[str]:
    """A note for a c10d endpoint on a loopback address: right for several launchers on one host (as a test runs them);
    a launcher on another host dials its own loopback and stops after cluster.rdzv_timeout_s."""
    host = endpoint_host(endpoint)
    if host != "localhost" and not host.startswith("127.") and host != "::1":
        return []
    return [f"cluster.rdzv_endpoint={endpoint} is a loopback address: only launchers on this host reach it (one on "
            f"another host would wait cluster.rdzv_timeout_s={timeout_s:g} s and stop); give the store host's address "
            f"as the other hosts reach it for a job of several hosts"]


def planned_nodes(cfg: DictConfig, backends: tuple[BackendRules, ...]) -> tuple[DictConfig, list[str]]:
    """(cfg with cluster.nnodes as the number of hosts planned for, the problems of the value given): MAX of
    MIN:MAX; a bad value plans as 1 host, its problem said."""
    value = cfg.cluster.nnodes
    chosen = backend_named(backends, cfg.cluster.launch)
    per_host = chosen is not None and chosen.launcher_per_host
    problems = node_range_problems(value, str(cfg.cluster.launch), per_host)
    if per_host and not problems:  # a dry run says it too, not only the launch
        problems = checkpoint_problems(cfg)
    got = node_range(value)
    nnodes = got[1] if got is not None and not problems else 1
    if isinstance(value, int) and not isinstance(value, bool) and value == nnodes and not problems:
        return cfg, []
    cfg = cfg.copy()
    cfg.cluster.nnodes = nnodes
    return cfg, problems
