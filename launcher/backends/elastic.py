"""cluster.launch=elastic: one launcher on every host; they meet at torch elastic's c10d rendezvous
(``cluster.rdzv_endpoint``), which gives each its node rank (``launcher.launch.nodes``); each then starts its host's
ranks as the local backend does."""

from __future__ import annotations

import re

from launcher.backends.base import Backend

HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[?[0-9A-Fa-f:.]+\]?")
"""A host name or an IPv4/IPv6 address: nothing a shell or a URL would read as more."""


class ElasticBackend(Backend):
    name = "elastic"
    help = "elastic (several hosts on torch elastic's rendezvous)"
    launcher_per_host = True
    restarts = False  # every host's launcher would have to agree on the restart: not built yet
    scripts = False

    def problems(self, c) -> list[str]:
        from launcher.plan.values import number_problems

        p = []
        host, _, port = str(c.rdzv_endpoint).rpartition(":")
        port_ok = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
        if not host or not HOST.fullmatch(host) or not port_ok:
            p.append(f"cluster.rdzv_endpoint={c.rdzv_endpoint or '(empty)'} must be <host>:<port> of one of the "
                     f"nodes, the same on every host, e.g. cluster.rdzv_endpoint=node0.cluster:29400.")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", str(c.rdzv_id)):
            p.append(f"cluster.rdzv_id={c.rdzv_id} must be a name of letters, digits, '.', '_' and '-'.")
        if c.local_addr and not HOST.fullmatch(str(c.local_addr)):
            p.append(f"cluster.local_addr={c.local_addr} must be a host name or an address, e.g. "
                     f"cluster.local_addr=10.0.0.2.")
        return p + number_problems("cluster", {"rdzv_timeout_s": (c.rdzv_timeout_s, "positive")})
