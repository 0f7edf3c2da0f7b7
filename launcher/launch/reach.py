"""How the hosts of an elastic job reach each other and their rendezvous (cluster.launch=elastic), checked on each
host before it meets the others: the address it advertises (``address_problems``), the interface its ranks'
sockets bind (``socket_ifname``), and what cluster.rdzv_backend needs here (``rendezvous_problems``)."""

from __future__ import annotations

import importlib.util
import socket
import urllib.error
import urllib.request

from omegaconf import DictConfig

from launcher.backends.elastic import RDZV_BACKENDS

ETCD_PROBE_S = 5.0
"""How long the etcd-v2 check waits for the etcd server's answer before the launch."""


def rendezvous_problems(cfg: DictConfig) -> list[str]:
    """cluster.rdzv_backend=etcd-v2 on this host: torch's etcd client needs the python-etcd package, and the etcd
    server at cluster.rdzv_endpoint must answer, with its v2 API on (etcd 3.4 serves it only with --enable-v2). Both
    found in seconds here, where torch's handler would fail later (an ImportError at its first call, or a read
    timeout of a minute)."""
    c = cfg.cluster
    if not RDZV_BACKENDS[str(c.rdzv_backend)].etcd:
        return []
    key = f"cluster.rdzv_backend=etcd-v2 (cluster.rdzv_endpoint={c.rdzv_endpoint})"
    if importlib.util.find_spec("etcd") is None:  # python-etcd, what torch's etcd-v2 backend imports
        return [f"{key} needs the python-etcd package on every host, which torch's etcd client imports: "
                f"pip install python-etcd (or use cluster.rdzv_backend=c10d)."]
    url = f"http://{c.rdzv_endpoint}/v2/keys"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as torch's client: no http_proxy
    try:
        with direct.open(url, timeout=ETCD_PROBE_S):
            return []
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return [f"{key}: the etcd server there does not serve the v2 API ({url}: 404) that torch's etcd-v2 "
                    f"backend speaks. Start etcd with --enable-v2=true."]
        return []  # it answered (an authentication it asks for is torch's client's to meet)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        return [f"{key}: no etcd server answered at {url} within {ETCD_PROBE_S:g} s ({reason}). Start an etcd "
                f"member there (etcd --enable-v2=true --listen-client-urls http://{c.rdzv_endpoint} ...), or set "
                f"cluster.rdzv_endpoint to one this host reaches."]


def address_problems(cfg: DictConfig) -> list[str]:
    """A job of several hosts on a host that would advertise a loopback address (no cluster.local_addr, and its name
    resolves to 127.0.1.1 as Debian's /etc/hosts and many containers have it): the others could not reach it."""
    from launcher.plan.nodes import node_range

    c = cfg.cluster
    if c.local_addr or node_range(c.nnodes)[1] < 2:
        return []
    name = socket.getfqdn()
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        return [f"cluster.local_addr is empty and this host's name {name} does not resolve: the other hosts could not "
                f"reach it. Set cluster.local_addr to this host's address as the others reach it{_own_addresses()}."]
    if not resolved.startswith("127."):
        return []
    return [f"cluster.local_addr is empty and this host's name {name} resolves to {resolved}, a loopback address "
            f"(/etc/hosts): the other hosts could not reach this one. Set cluster.local_addr to this host's address "
            f"as the others reach it{_own_addresses()}, or make {name} resolve to it."]


def socket_ifname(addr: str) -> str | None:
    """The network interface of this host that holds ``addr`` (a name is resolved first), or None: what gloo's and
    NCCL's sockets are bound to (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) when cluster.local_addr says which address
    this host is reached by (they would bind the address its name resolves to, which may be a loopback one)."""
    try:
        ip = socket.gethostbyname(addr)
    except OSError:  # a name that does not resolve: the libraries' own choice
        return None
    return next((name for name, address in _inet_addresses() if address == ip), None)


def _own_addresses() -> str:
    """', e.g. cluster.local_addr=<a non-loopback address of this host>' where one is found."""
    found = [address for _, address in _inet_addresses() if not address.startswith("127.")]
    return f", e.g. cluster.local_addr={found[0]}" if found else ""


def _inet_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of this host's interfaces; none when psutil is missing or cannot read them."""
    try:
        import psutil

        return [(name, a.address) for name, addrs in psutil.net_if_addrs().items() for a in addrs
                if a.family == socket.AF_INET]
    except Exception:  # noqa: BLE001 - psutil missing or the interfaces unreadable
        return []