"""DeepSpeed-style hostfiles and DeepSpeed's --include/--exclude filters, read strictly into a ClusterLayout. Pure:
the caller reads the file.

A hostfile has one host per line, ``worker-1 slots=4`` (slots: ranks on that host, one per accelerator), blank
lines and ``#`` comments; OpenMPI's ``max_slots=M`` may follow (its cap on the ranks there: at least slots). The
filters take DeepSpeed's syntax, ``NAME[:SLOT[,SLOT...]]`` joined by ``@``:
``worker-0@worker-1:0,2`` is every slot of worker-0 and slots 0 and 2 of worker-1. Hosts keep the hostfile's order
and slots the order given (DeepSpeed makes that order the rank's CUDA_VISIBLE_DEVICES). Stricter than DeepSpeed:
slots=0, a host name that is not a host name or address, anything on a line after slots=N other than max_slots=M
and a comment, a host or slot named twice in a filter, and a filter that leaves nothing are refused, not ignored.
Every problem is collected into one ConfigError, each naming the line or the entry and a fix."""

from __future__ import annotations

import difflib
import re

from launcher.errors import ConfigError
from launcher.plan.layout import ClusterLayout, RankSlot, address_problem, layout_problem, shown

__all__ = ["parse_hostfile", "filter_hosts", "hostfile_layout"]

_SLOTS = re.compile(r"[1-9][0-9]{0,5}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,5}")
INCLUDE, EXCLUDE = "cluster.include", "cluster.exclude"


def parse_hostfile(text: str, source: str) -> list[tuple[str, int]]:
    """[(host, slots)] in file order, or one ConfigError naming each bad line (source line N "text")."""
    problems: list[str] = []
    hosts: list[tuple[str, int]] = []
    line_of: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        at = f"{source} line {n} {shown(line)}"
        host, *rest = content.split()
        why = address_problem(host)
        if why:
            problems.append(f"{at}: the host {shown(host)} {why}. Write a host name or IP address, e.g. "
                            f"worker-1 slots=4.")
        slots, cap = _line_slots(at, host, rest, problems)
        if slots is None:
            continue
        if cap is not None and cap < slots:
            problems.append(f"{at}: max_slots={cap} is below slots={slots}, and the run puts slots ranks on "
                            f"{host}. Raise max_slots or lower slots.")
            continue
        if host in line_of:
            problems.append(f"{at}: {host} is also on line {line_of[host]}. Give each host once, with all its slots.")
            continue
        line_of[host] = n
        hosts.append((host, slots))
    if not hosts and not problems:
        problems.append(f"{source}: no hosts (only blank lines and comments). Write one line per host, e.g. "
                        f"worker-0 slots=4.")
    if problems:
        raise ConfigError(problems)
    return hosts


def _line_slots(at: str, host: str, rest: list[str], problems: list[str]) -> tuple[int | None, int | None]:
    """(slots, OpenMPI's max_slots or None) of a line's words after the host; (None, None) with the problem appended.
    max_slots (or max-slots) caps what OpenMPI may oversubscribe; the run puts exactly slots ranks there."""
    values: dict[str, str] = {}
    for word in rest:
        key, eq, value = word.partition("=")
        key = "max_slots" if key == "max-slots" else key
        if not eq or key not in ("slots", "max_slots") or key in values:
            problems.append(f"{at}: a line is <host> slots=<N> (DeepSpeed's and OpenMPI's form, OpenMPI's "
                            f"max_slots=<M> too); {shown(word)} is not read. Remove it (a comment starts with #).")
            return None, None
        values[key] = value
    if "slots" not in values:
        problems.append(f"{at}: no slots. Write {host} slots=<ranks on that host>, e.g. {host} slots=4.")
        return None, None
    for key, value in values.items():
        if not _SLOTS.fullmatch(value):
            problems.append(f"{at}: {key}={value} must be a whole number > 0 (ranks on that host). E.g. "
                            f"{host} slots=4.")
            return None, None
    cap = values.get("max_slots")
    return int(values["slots"]), None if cap is None else int(cap)


def filter_hosts(hosts: list[tuple[str, int]], include: str, exclude: str,
                 source: str = "the hostfile") -> list[tuple[str, list[int]]]:
    """The slots to run on per host, [(host, [slot, ...])], after DeepSpeed's include or exclude filter (give one
    or neither); hosts with no slot left are dropped. One ConfigError for every problem."""
    pool = dict(hosts)
    if include and exclude:
        raise ConfigError(f"{INCLUDE}={shown(include)} and {EXCLUDE}={shown(exclude)}: give one of them, not both "
                          f"(as DeepSpeed's --include and --exclude). Keep {INCLUDE} or {EXCLUDE}.")
    problems: list[str] = []
    if include:
        chosen = _spec(INCLUDE, include, pool, source, problems)
        picked = [(h, list(range(pool[h])) if chosen[h] is None else chosen[h]) for h in pool if h in chosen]
    elif exclude:
        gone = _spec(EXCLUDE, exclude, pool, source, problems)  # a host without slots: all of it
        picked = [(h, [s for s in range(n) if h not in gone or gone[h] is not None and s not in gone[h]])
                  for h, n in hosts]
    else:
        picked = [(h, list(range(n))) for h, n in hosts]
    picked = [(h, slots) for h, slots in picked if slots]
    if not problems and not picked:
        key, value = (INCLUDE, include) if include else (EXCLUDE, exclude)
        problems.append(f"{key}={shown(value)} leaves no slot of {source} to run on. Exclude fewer.")
    if problems:
        raise ConfigError(problems)
    return picked


def hostfile_layout(picked: list[tuple[str, list[int]]], source: str) -> ClusterLayout:
    """The layout of filter_hosts' result: hosts in order, ranks numbered host by host; each rank's device_id is its
    slot. Every host needs the same number of slots."""
    problem = layout_problem({h: len(slots) for h, slots in picked}, "slots", source)
    if problem:
        raise ConfigError(problem)
    ranks = []
    for node, (host, slots) in enumerate(picked):
        for local, slot in enumerate(slots):
            ranks.append(RankSlot(rank=len(ranks), node_rank=node, local_rank=local, device_id=slot, host=host))
    return ClusterLayout(hosts=tuple(h for h, _ in picked), nproc_per_node=len(picked[0][1]) if picked else 0,
                         ranks=tuple(ranks), source=source)


def _spec(key: str, text: str, pool: dict[str, int], source: str, problems: list[str]) -> dict[str, list[int] | None]:
    """{host: [slots] or None for all of them} of NAME[:SLOT[,SLOT...]]@...; problems appended."""
    chosen: dict[str, list[int] | None] = {}
    at = f"{key}={shown(text)}"
    for part in text.split("@"):
        name, colon, slot_text = part.partition(":")
        if not name:
            problems.append(f"{at}: an entry without a host name ({shown(part)}). Write NAME[:SLOT[,SLOT...]] "
                            f"joined by '@', e.g. worker-0@worker-1:0,2.")
            continue
        if name not in pool:
            close = difflib.get_close_matches(name, list(pool), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]}?" if close else f" Its hosts: {', '.join(list(pool)[:8])}."
            problems.append(f"{at}: {shown(name)} is not a host of {source}.{hint}")
            continue
        if name in chosen:
            problems.append(f"{at}: {name} is named twice. Name each host once, with all its slots (e.g. {name}:0,1).")
            continue
        if not colon:
            chosen[name] = None
            continue
        slots: list[int] = []
        for s in slot_text.split(","):
            if not _INDEX.fullmatch(s):
                problems.append(f"{at}: {name}:{slot_text}: slot {shown(s)} is not a slot number. Slots are "
                                f"0..{pool[name] - 1} on {name} (slots={pool[name]}), comma-separated.")
            elif int(s) >= pool[name]:
                problems.append(f"{at}: {name} has no slot {s}; {source} gives it slots={pool[name]} "
                                f"(slots 0..{pool[name] - 1}).")
            elif int(s) in slots:
                problems.append(f"{at}: slot {s} of {name} is named twice. Name each slot once.")
            else:
                slots.append(int(s))
        chosen[name] = slots
    return chosen
