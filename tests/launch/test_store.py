"""The launcher's rendezvous store listens on master_addr only (loopback by default), on a free port for port 0."""

import socket
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from launcher.launch.store import host_store


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on port (IPv4 and IPv6), from /proc/net."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]) if len(addr) == 8 else addr)
    return found


def test_the_store_listens_on_loopback_only_and_a_rank_can_reach_it():
    store = host_store("127.0.0.1", 0)
    assert store.port > 0
    assert _listening_addresses(store.port) == {"127.0.0.1"}
    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("hello", "rank")
    assert store.get("hello") == b"rank"


def test_a_busy_port_is_refused():
    store = host_store("127.0.0.1", 0)
    with pytest.raises(OSError):
        host_store("127.0.0.1", store.port)
