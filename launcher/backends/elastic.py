"""cluster.launch=elastic: one launcher on every host; they meet at torch elastic's c10d rendezvous
(``cluster.rdzv_endpoint``), which gives each its node rank (``launcher.launch.nodes``); each then starts its host's
ranks as the local backend does. With launcher.max_restarts > 0 and cluster.nnodes=MIN:MAX they meet again after a
failure, a lost host or a host waiting to join (``launcher.launch.elastic_agent``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.backends.base import Backend

HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[?[0-9A-Fa-f:.]+\]?")
"""A host name or an IPv4/IPv6 address: nothing a shell or a URL would read as more."""


@dataclass(frozen=True)
class Rendezvous:
    """What one of torch's rendezvous backends (cluster.rdzv_backend) needs of the job and of each host."""

    store_in_launcher: bool
    """The store lives in the launcher of the endpoint's host (c10d): that host hosts it, and losing it ends the job;
    False: a service holds it (etcd), and no launcher does."""
    etcd: bool = False
    """The store is an etcd server's (its v2 API): each host needs the python-etcd package and the server's v2 API
    (launcher.launch.reach), and etcd keeps a job's keys after the job."""


RDZV_BACKENDS = {"c10d": Rendezvous(store_in_launcher=True), "etcd-v2": Rendezvous(store_in_launcher=False, etcd=True)}
"""torch's backends of its dynamic rendezvous (torch.distributed.elastic.rendezvous.registry), the ones whose
handler gives each round a store (the older "etcd" handler has no keep-alive and a store of another kind), by name;
no module outside this one compares their names."""


class ElasticBackend(Backend):
    name = "elastic"
    help = "elastic (several hosts on torch elastic's rendezvous)"
    launcher_per_host = True
    restarts = True  # the launchers meet again at the rendezvous (launcher.launch.elastic_agent)
    scripts = False
    rdzv_backends = RDZV_BACKENDS
    reads = ("rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf", "rdzv_timeout_s", "heartbeat_timeout_s",
             "local_addr")

    def problems(self, c) -> list[str]:
        from launcher.plan.values import number_problems

        p = []
        host, _, port = str(c.rdzv_endpoint).rpartition(":")
        port_ok = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
        if not host or not HOST.fullmatch(host) or not port_ok:
            p.append(f"cluster.rdzv_endpoint={c.rdzv_endpoint or '(empty)'} must be <host>:<port> of one of the "
                     f"nodes, the same on every host (cluster.launch=elastic's hosts meet there), e.g. "
                     f"cluster.rdzv_endpoint=node0.cluster:29400.")
        if c.rdzv_backend not in RDZV_BACKENDS:
            p.append(f"cluster.rdzv_backend={c.rdzv_backend} is not a rendezvous backend the launcher runs: use "
                     f"{' or '.join(RDZV_BACKENDS)} (torch's dynamic rendezvous on a TCP store in a launcher, or on "
                     f"an etcd server).")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", str(c.rdzv_id)):
            p.append(f"cluster.rdzv_id={c.rdzv_id} must be a name of letters, digits, '.', '_' and '-'.")
        if c.local_addr and not HOST.fullmatch(str(c.local_addr)):
            p.append(f"cluster.local_addr={c.local_addr} must be a host name or an address, e.g. "
                     f"cluster.local_addr=10.0.0.2.")
        return p + rdzv_conf_problems(c.rdzv_conf) + number_problems(
            "cluster", {"rdzv_timeout_s": (c.rdzv_timeout_s, "positive"),
                        "heartbeat_timeout_s": (c.heartbeat_timeout_s, "positive")})


RDZV_CONF = ("last_call_timeout", "keep_alive_interval", "keep_alive_max_attempt", "close_timeout", "read_timeout")
"""The settings of torch's dynamic rendezvous handler (DynamicRendezvousHandler.from_backend; read_timeout also by
the etcd-v2 backend's client) we pass on, each a whole number of seconds (or attempts)."""


def rdzv_conf_problems(conf) -> list[str]:
    """cluster.rdzv_conf: only torch's own setting names, each a positive integer (torch reads them as int)."""
    p = []
    for key, value in dict(conf or {}).items():
        if key not in RDZV_CONF:
            p.append(f"cluster.rdzv_conf.{key} is not a setting of torch's rendezvous: use {', '.join(RDZV_CONF)}.")
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 86400:
            p.append(f"cluster.rdzv_conf.{key}={value} must be a whole number from 1 to 86400, e.g. "
                     f"cluster.rdzv_conf.{key}=5.")
    return p
