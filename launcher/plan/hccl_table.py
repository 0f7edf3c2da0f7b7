"""Reading a MindSpore/HCCL rank table (version 1.0, as MindSpore's hccl_tools.py and merge_hccl.py write it) into a
ClusterLayout. Pure: the caller reads the file and parses the JSON.

The form, every value a string::

    {"version": "1.0", "server_count": "2",
     "server_list": [{"server_id": "10.155.111.140",
                      "device": [{"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"}, ...],
                      "host_nic_ip": "reserve"}, ...],
     "status": "completed"}

Servers are nodes in the order listed; a device's rank_id is its global rank; its local rank is its index among its
server's devices ordered by rank_id. Each server's ranks must be one consecutive block in server order (what
merge_hccl.py writes, and how torchrun numbers ranks: node_rank * nproc_per_node + local_rank). Integers where HCCL
writes strings are refused with the quoted form to write, like any other problem: all problems are collected and
raised as one ConfigError, each naming the entry (``server_list[1].device[0].rank_id="3"``) and a fix."""

from __future__ import annotations

import difflib
import re

from launcher.errors import ConfigError
from launcher.plan.layout import ClusterLayout, RankSlot, address_problem, layout_problem, shown

__all__ = ["ClusterLayout", "RankSlot", "parse_rank_table", "VERSION"]

VERSION = "1.0"
TOP_KEYS = {"version": '"1.0"', "server_count": '"<number of servers>"', "server_list": "[...]",
            "status": '"completed"'}
SERVER_KEYS = {"server_id": '"<the server\'s IP address>"', "device": "[...]"}
SERVER_OPTIONAL = ("host_nic_ip", "host_ip", "container_ip", "pod_ip")
"""Tolerated, not used: host_nic_ip is HCCL's reserved field (always "reserve"); the others appear in Ascend's and
MindSpore's own tables and must be "reserve" or an address."""
DEVICE_KEYS = {"device_id": '"0"', "device_ip": '"<the device NIC\'s IP, address_<id> in /etc/hccn.conf>"',
               "rank_id": '"0"'}
_WHOLE = re.compile(r"0|[1-9][0-9]{0,8}")
"""A count or index as HCCL writes it: decimal digits, no sign, no leading zero, below 10**9."""


def parse_rank_table(obj: dict, source: str) -> ClusterLayout:
    """The layout a rank table describes, or one ConfigError listing every problem. source names the table in
    messages (e.g. cluster.rank_table_file=hccl_8p.json)."""
    p = _Problems(source)
    if not isinstance(obj, dict):
        raise ConfigError(f"{source}: a rank table is a JSON object "
                          f'({{"version": "1.0", "server_count": ..., "server_list": [...], "status": "completed"}}); '
                          f"got {type(obj).__name__}. Write it as MindSpore's hccl_tools.py does.")
    p.keys("", obj, TOP_KEYS, ())
    version = p.text("version", obj.get("version", VERSION))
    if version is not None and version != VERSION:
        p.add(f"version={shown(version)}: only rank tables of version {VERSION} are read (what hccl_tools.py and "
              f"merge_hccl.py write; 1.2 is the Atlas A3 super-pod form). Write the table in version {VERSION} form.")
    status = p.text("status", obj.get("status", "completed"))
    if status is not None and status != "completed":
        p.add(f'status={shown(status)}: the table is not complete; HCCL reads only a table whose status is '
              f'"completed". Finish it and set "status": "completed".')
    servers = obj.get("server_list", [])
    if not isinstance(servers, list) or not servers and "server_list" in obj:
        p.add(f"server_list={shown(servers)}: must be a non-empty list of servers "
              f'({{"server_id": ..., "device": [...], "host_nic_ip": "reserve"}}). List every server once.')
        servers = []
    count = p.whole("server_count", obj.get("server_count", str(len(servers))))
    if count is not None and servers and count != len(servers):
        p.add(f'server_count="{count}": server_list has {len(servers)} server{"s" if len(servers) != 1 else ""}. '
              f'Write "server_count": "{len(servers)}".')

    rows: list[tuple[int, int, int, str]] = []  # (rank, server index, device id, where)
    hosts: list[str] = []
    per_server: dict[str, int] = {}
    first_host: dict[str, str] = {}
    for i, server in enumerate(servers):
        at = f"server_list[{i}]"
        if not isinstance(server, dict):
            p.add(f"{at}={shown(server)}: a server is an object "
                  f'({{"server_id": ..., "device": [...], "host_nic_ip": "reserve"}}). Write it as one.')
            hosts.append("")
            continue
        p.keys(at, server, SERVER_KEYS, SERVER_OPTIONAL)
        host = p.address(f"{at}.server_id", server.get("server_id", "")) if "server_id" in server else None
        if host is not None:
            if host in first_host:
                p.add(f"{at}.server_id={shown(host)}: also {first_host[host]}. List each server once, with all its "
                      f"devices.")
            first_host.setdefault(host, f"{at}.server_id")
        hosts.append(host or "")
        nic = server.get("host_nic_ip", "reserve")
        if p.text(f"{at}.host_nic_ip", nic) not in (None, "reserve"):
            p.add(f'{at}.host_nic_ip={shown(nic)}: HCCL reserves this field; its only value is "reserve". '
                  f'Write "host_nic_ip": "reserve".')
        for key in SERVER_OPTIONAL[1:]:
            if key in server and p.text(f"{at}.{key}", server[key]) not in (None, "reserve"):
                p.address(f"{at}.{key}", server[key])
        devices = server.get("device", [])
        if not isinstance(devices, list) or not devices and "device" in server:
            p.add(f"{at}.device={shown(devices)}: must be a non-empty list of devices "
                  f'({{"device_id": "0", "device_ip": ..., "rank_id": "0"}}). List the server\'s devices.')
            devices = []
        per_server[at] = len(devices)
        device_ids: dict[int, str] = {}
        for j, device in enumerate(devices):
            dat = f"{at}.device[{j}]"
            if not isinstance(device, dict):
                p.add(f"{dat}={shown(device)}: a device is an object "
                      f'({{"device_id": "0", "device_ip": ..., "rank_id": "0"}}). Write it as one.')
                continue
            p.keys(dat, device, DEVICE_KEYS, ())
            device_id = p.whole(f"{dat}.device_id", device["device_id"]) if "device_id" in device else None
            if device_id is not None:
                if device_id in device_ids:
                    p.add(f'{dat}.device_id="{device_id}": also {device_ids[device_id]} on this server. Give each '
                          f"device of a server once.")
                device_ids.setdefault(device_id, f"{dat}.device_id")
            if "device_ip" in device:
                p.address(f"{dat}.device_ip", device["device_ip"])
            rank = p.whole(f"{dat}.rank_id", device["rank_id"]) if "rank_id" in device else None
            if rank is not None:
                rows.append((rank, i, device_id if device_id is not None else -1, f"{dat}.rank_id"))

    world = sum(per_server.values())
    p.ranks(rows, world)
    p.add_raw(layout_problem(per_server, "devices", source))
    if not p.problems:
        p.blocks(rows, len(servers), world // max(1, len(servers)))
    if p.problems:
        raise ConfigError(p.problems)

    nproc = world // len(servers)  # server n holds ranks n*nproc.. (blocks): a rank's local rank is its offset there
    slots = tuple(RankSlot(rank=rank, node_rank=node, local_rank=rank - node * nproc, device_id=device_id,
                           host=hosts[node]) for rank, node, device_id, _ in sorted(rows))
    return ClusterLayout(hosts=tuple(hosts), nproc_per_node=nproc, ranks=slots, source=source)


class _Problems:
    """Collects sentences, each starting with the table's source."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def add(self, sentence: str) -> None:
        self.problems.append(f"{self.source}: {sentence}")

    def add_raw(self, sentence: str) -> None:
        if sentence:
            self.problems.append(sentence)

    def keys(self, at: str, entry: dict, required: dict[str, str], optional: tuple[str, ...]) -> None:
        """Missing required keys (with the value to write) and unknown keys (with a did-you-mean)."""
        prefix = f"{at}." if at else ""
        for key, example in required.items():
            if key not in entry:
                where = at or "the table"
                self.add(f'{where} has no "{key}". Add "{key}": {example}, as hccl_tools.py writes it.')
        known = [*required, *optional]
        for key in entry:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                hint = f' Did you mean "{close[0]}"?' if close else f" Known keys here: {', '.join(known)}."
                self.add(f"{prefix}{key}={shown(entry[key])}: no such key in a version {VERSION} rank table.{hint} "
                         f"Remove or rename it.")

    def text(self, at: str, value: object) -> str | None:
        """value when it is a string; else a problem and None."""
        if isinstance(value, str):
            return value
        key = at.rsplit(".", 1)[-1]
        if isinstance(value, int) and not isinstance(value, bool):
            self.add(f'{at}={shown(value)}: HCCL reads a string here, not a number (some merge_hccl.py versions wrote '
                     f'numbers). Write "{key}": "{value}".')
        else:
            self.add(f"{at}={shown(value)}: must be a string, as HCCL writes every value of a rank table.")
        return None

    def whole(self, at: str, value: object) -> int | None:
        """A count or index written as a string of decimal digits, or a problem and None."""
        text = self.text(at, value)
        if text is None:
            return None
        if not _WHOLE.fullmatch(text):
            key = at.rsplit(".", 1)[-1]
            self.add(f"{at}={shown(text)}: must be a whole number >= 0 written in decimal digits, without sign, "
                     f'spaces or leading zeros (e.g. "{key}": "3").')
            return None
        return int(text)

    def address(self, at: str, value: object) -> str | None:
        """A host name or IP address, or a problem and None."""
        text = self.text(at, value)
        if text is None:
            return None
        why = address_problem(text)
        if why:
            self.add(f"{at}={shown(text)}: {why}. Give the IP address (or host name) only, e.g. \"10.0.0.1\".")
            return None
        return text

    def ranks(self, rows: list[tuple[int, int, int, str]], world: int) -> None:
        """Every rank_id in 0..world-1, each exactly once."""
        seen: dict[int, str] = {}
        for rank, _, _, where in rows:
            if rank >= world:
                self.add(f'{where}="{rank}": out of range: {world} devices take rank_ids 0..{world - 1}. Number the '
                         f"ranks 0..{world - 1}, each once.")
            elif rank in seen:
                self.add(f'{where}="{rank}": rank {rank} is also {seen[rank]}. Number the ranks 0..{world - 1}, '
                         f"each once.")
            seen.setdefault(rank, where)
        missing = [r for r in range(world) if r not in seen]
        if missing and len(rows) == world:  # else an unreadable rank_id was reported already
            listed = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
            self.add(f"rank_id {listed}: no device has {'it' if len(missing) == 1 else 'them'}; {world} devices "
                     f"take rank_ids 0..{world - 1}, each once.")

    def blocks(self, rows: list[tuple[int, int, int, str]], nservers: int, nproc: int) -> None:
        """Server n holds ranks n*nproc .. n*nproc+nproc-1 (torchrun's numbering)."""
        for node in range(nservers):
            held = sorted(rank for rank, n, _, _ in rows if n == node)
            want = list(range(node * nproc, (node + 1) * nproc))
            if held != want:
                self.add(f"server_list[{node}] holds rank_ids {', '.join(map(str, held))}: each server's ranks must be "
                         "one consecutive block in server order, as torchrun numbers them (node_rank * nproc_per_node "
                         f"+ local_rank). Give server_list[{node}] rank_ids {want[0]}..{want[-1]}.")
