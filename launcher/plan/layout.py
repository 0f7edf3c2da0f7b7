"""A cluster described from outside (a rank table, a hostfile): which host runs which global rank on which device.

Pure data and the address rule both readers share. Hosts and addresses read from a file end up in argument lists
of ssh, pdsh or mpirun and in environment variables, so only plain host names and IP addresses pass: no spaces,
quotes, shell metacharacters, empty labels ('..') or a leading '-' that a tool would take for an option."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from contextlib import suppress
from dataclasses import dataclass

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")
_ALLOWED = ".-_:%"
"""Besides ASCII letters and digits: what host names ('.-_') and IPv6 addresses (':', '%' before a zone) use."""
HOSTNAME_MAX = 253
"""Characters of a DNS name (RFC 1035), dots included."""


@dataclass(frozen=True)
class RankSlot:
    """One global rank of a described cluster."""

    rank: int
    node_rank: int
    """Index of its host in ClusterLayout.hosts."""
    local_rank: int
    """Index among its host's ranks, ordered by global rank."""
    device_id: int
    """The accelerator the description assigns (a rank table's device_id; a hostfile's slot)."""
    host: str


@dataclass(frozen=True)
class ClusterLayout:
    """Hosts in node order, the same number of ranks on each, and every global rank's place (ranks[r].rank == r)."""

    hosts: tuple[str, ...]
    nproc_per_node: int
    ranks: tuple[RankSlot, ...]
    source: str
    """Where it was read from, for messages (e.g. cluster.rank_table_file=hccl_8p.json)."""

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def address_problem(value: str) -> str:
    """'' when value is an IPv4/IPv6 address or a host name (RFC 1123 labels, '_' tolerated inside one); else what
    is wrong with it, as a clause."""
    if value == "":
        return "is empty"
    odd = next((c for c in value if not (c.isascii() and (c.isalnum() or c in _ALLOWED))), "")
    if odd:
        return f"contains {json.dumps(odd)}, which no host name or IP address has"
    with suppress(ValueError):
        ipaddress.ip_address(value)
        return ""
    if len(value) > HOSTNAME_MAX:
        return f"is longer than {HOSTNAME_MAX} characters"
    labels = value.split(".")
    if all(label.isdigit() for label in labels):
        return "is not a valid IPv4 address"
    if not all(_LABEL.fullmatch(label) for label in labels):
        return ("is neither an IP address nor a host name (letters, digits, '-' and '_' in dot-separated labels, each "
                "starting and ending with a letter or digit)")
    return ""


def endpoint_host(endpoint: str) -> str:
    """The host of a <host>:<port> endpoint (cluster.rdzv_endpoint), an IPv6 address without its brackets."""
    return str(endpoint).rpartition(":")[0].strip("[]")


def shown(value: object, limit: int = 60) -> str:
    """A value as it is written in JSON (quotes and escapes visible, nothing obeyed), cut to about limit characters."""
    text = json.dumps(value, default=repr)  # JSON values as written; anything else (a caller's object) by repr
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text)} characters)"


def layout_problem(counts: dict[str, int], what: str, source: str) -> str:
    """One sentence when the hosts do not all have the same number of ranks ({host: ranks}); else ''."""
    if len(set(counts.values())) <= 1:
        return ""
    listed = ", ".join(f"{host}: {n}" for host, n in counts.items())
    return (f"{source}: the hosts have different numbers of {what} ({listed}); every host must run the same number "
            f"of ranks (torch's nproc_per_node is one number). Use the same count on every host.")
