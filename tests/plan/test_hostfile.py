"""DeepSpeed-style hostfiles and --include/--exclude filters: DeepSpeed's results, and strict refusals by line."""

import pytest

from launcher.errors import ConfigError
from launcher.plan.hostfile import filter_hosts, hostfile_layout, parse_hostfile

SRC = "cluster.hostfile=hosts"
HOSTFILE = """\
# the pool
worker-0 slots=4

worker-1   slots=4   # second box
\tworker-2 slots=4
"""
HOSTS = [("worker-0", 4), ("worker-1", 4), ("worker-2", 4)]


def refused(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_hostfile(text, SRC)
    return e.value.problems


def test_parse_comments_blank_lines_and_white_space():
    assert parse_hostfile(HOSTFILE, SRC) == HOSTS
    assert parse_hostfile("10.0.0.1 slots=8\nfe80::2 slots=8\n", SRC) == [("10.0.0.1", 8), ("fe80::2", 8)]


def test_openmpi_max_slots_is_read_as_a_cap():
    """OpenMPI's hostfile form (multi_node.md says an existing one works): max_slots=M (or max-slots), before or
    after slots, is its cap on the ranks of that host; the run puts slots ranks there, so it must be at least slots."""
    assert parse_hostfile("a slots=2 max_slots=4\nb max-slots=2 slots=2\n", SRC) == [("a", 2), ("b", 2)]


def test_bad_lines_each_named():
    text = "worker-0 slots=4\nworker-1\nworker-2 slots=0\nworker-3 slots=four\nworker-0 slots=2\n" \
           "worker-4 slots=2 gpus=4\n10.0.0.1;rm slots=1\n$(id) slots=1\nworker-5 slots=4 max_slots=2\n" \
           "worker-6 slots=2 slots=3\n"
    found = refused(text)
    assert found == [
        f'{SRC} line 2 "worker-1": no slots. Write worker-1 slots=<ranks on that host>, e.g. worker-1 slots=4.',
        f'{SRC} line 3 "worker-2 slots=0": slots=0 must be a whole number > 0 (ranks on that host). '
        f'E.g. worker-2 slots=4.',
        f'{SRC} line 4 "worker-3 slots=four": slots=four must be a whole number > 0 (ranks on that host). '
        f'E.g. worker-3 slots=4.',
        f'{SRC} line 5 "worker-0 slots=2": worker-0 is also on line 1. Give each host once, with all its slots.',
        f'{SRC} line 6 "worker-4 slots=2 gpus=4": a line is <host> slots=<N> (DeepSpeed\'s and OpenMPI\'s form, '
        f'OpenMPI\'s max_slots=<M> too); "gpus=4" is not read. Remove it (a comment starts with #).',
        f'{SRC} line 7 "10.0.0.1;rm slots=1": the host "10.0.0.1;rm" contains ";", which no host name or IP address '
        f'has. Write a host name or IP address, e.g. worker-1 slots=4.',
        f'{SRC} line 8 "$(id) slots=1": the host "$(id)" contains "$", which no host name or IP address has. '
        f'Write a host name or IP address, e.g. worker-1 slots=4.',
        f'{SRC} line 9 "worker-5 slots=4 max_slots=2": max_slots=2 is below slots=4, and the run puts slots ranks on '
        f'worker-5. Raise max_slots or lower slots.',
        f'{SRC} line 10 "worker-6 slots=2 slots=3": a line is <host> slots=<N> (DeepSpeed\'s and OpenMPI\'s form, '
        f'OpenMPI\'s max_slots=<M> too); "slots=3" is not read. Remove it (a comment starts with #).',
    ]


def test_empty_hostfile():
    assert refused("# nothing\n\n") == [
        f"{SRC}: no hosts (only blank lines and comments). Write one line per host, e.g. worker-0 slots=4."]


def test_include_and_exclude_as_deepspeed():
    assert filter_hosts(HOSTS, "", "") == [("worker-0", [0, 1, 2, 3]), ("worker-1", [0, 1, 2, 3]),
                                           ("worker-2", [0, 1, 2, 3])]
    # DeepSpeed's own example: all slots of worker-0, slots 0 and 2 of worker-1; hosts keep the hostfile's order.
    assert filter_hosts(HOSTS, "worker-1:0,2@worker-0", "") == [("worker-0", [0, 1, 2, 3]), ("worker-1", [0, 2])]
    assert filter_hosts(HOSTS, "worker-2:3,1", "") == [("worker-2", [3, 1])]  # slot order kept, as DeepSpeed does
    assert filter_hosts(HOSTS, "", "worker-1:0") == [("worker-0", [0, 1, 2, 3]), ("worker-1", [1, 2, 3]),
                                                     ("worker-2", [0, 1, 2, 3])]
    assert filter_hosts(HOSTS, "", "worker-0@worker-2:0,1") == [("worker-1", [0, 1, 2, 3]), ("worker-2", [2, 3])]


def test_filter_errors_named():
    with pytest.raises(ConfigError, match=r'cluster.include="worker-0" and cluster.exclude="worker-1": give one'):
        filter_hosts(HOSTS, "worker-0", "worker-1")
    with pytest.raises(ConfigError) as e:
        filter_hosts(HOSTS, "wroker-1@worker-1:4,x,1,1@@worker-0@worker-0", "", source="hosts")
    at = 'cluster.include="wroker-1@worker-1:4,x,1,1@@worker-0@worker-0": '
    assert e.value.problems == [
        at + '"wroker-1" is not a host of hosts. Did you mean worker-1?',
        at + "worker-1 has no slot 4; hosts gives it slots=4 (slots 0..3).",
        at + 'worker-1:4,x,1,1: slot "x" is not a slot number. Slots are 0..3 on worker-1 (slots=4), comma-separated.',
        at + "slot 1 of worker-1 is named twice. Name each slot once.",
        at + "an entry without a host name (\"\"). Write NAME[:SLOT[,SLOT...]] joined by '@', "
             "e.g. worker-0@worker-1:0,2.",
        at + "worker-0 is named twice. Name each host once, with all its slots (e.g. worker-0:0,1).",
    ]
    with pytest.raises(ConfigError, match=r'cluster.exclude="worker-0@worker-1@worker-2" leaves no slot'):
        filter_hosts(HOSTS, "", "worker-0@worker-1@worker-2")


def test_layout_from_the_filtered_hosts():
    layout = hostfile_layout(filter_hosts(HOSTS, "worker-0:1,3@worker-2:0,2", ""), SRC)
    assert layout.hosts == ("worker-0", "worker-2") and (layout.nproc_per_node, layout.world_size) == (2, 4)
    assert [(s.rank, s.node_rank, s.local_rank, s.device_id, s.host) for s in layout.ranks] == [
        (0, 0, 0, 1, "worker-0"), (1, 0, 1, 3, "worker-0"), (2, 1, 0, 0, "worker-2"), (3, 1, 1, 2, "worker-2")]
    with pytest.raises(ConfigError, match=r"different numbers of slots \(worker-0: 4, worker-1: 3, worker-2: 4\)"):
        hostfile_layout(filter_hosts(HOSTS, "", "worker-1:0"), SRC)
