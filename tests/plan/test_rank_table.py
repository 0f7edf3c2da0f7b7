"""Reading MindSpore/HCCL rank tables: the layout they describe, and every malformed table refused by entry."""

import copy
import json

import pytest

from launcher.errors import ConfigError
from launcher.plan.layout import RankSlot, address_problem
from launcher.plan.hccl_table import parse_rank_table
from launcher.plan.ranks import plan_ranks, rank_table

SRC = "cluster.rank_table_file=hccl.json"


def table(*servers: tuple[str, list[tuple[str, str, str]]], count: str | None = None) -> dict:
    """A version 1.0 table: servers as (server_id, [(device_id, device_ip, rank_id), ...])."""
    return {
        "version": "1.0",
        "server_count": count if count is not None else str(len(servers)),
        "server_list": [
            {"server_id": sid,
             "device": [{"device_id": d, "device_ip": ip, "rank_id": r} for d, ip, r in devices],
             "host_nic_ip": "reserve"}
            for sid, devices in servers
        ],
        "status": "completed",
    }


def two_by_two() -> dict:
    return table(("10.0.0.1", [("0", "192.1.27.6", "0"), ("1", "192.2.27.6", "1")]),
                 ("10.0.0.2", [("0", "192.1.27.7", "2"), ("1", "192.2.27.7", "3")]))


def problems(obj) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_rank_table(obj, SRC)
    assert all(p.startswith(SRC) for p in e.value.problems)
    return e.value.problems


def test_two_servers_two_devices():
    layout = parse_rank_table(two_by_two(), SRC)
    assert layout.hosts == ("10.0.0.1", "10.0.0.2")
    assert (layout.nnodes, layout.nproc_per_node, layout.world_size) == (2, 2, 4)
    assert [(s.rank, s.node_rank, s.local_rank, s.device_id, s.host) for s in layout.ranks] == [
        (0, 0, 0, 0, "10.0.0.1"), (1, 0, 1, 1, "10.0.0.1"), (2, 1, 0, 0, "10.0.0.2"), (3, 1, 1, 1, "10.0.0.2")]
    assert json.loads(json.dumps(layout.to_dict()))["nproc_per_node"] == 2


def test_local_rank_follows_rank_id_not_listing_order():
    # MindSpore's own tests list a server's devices with rearranged rank ids (device 0 is rank 3, ...).
    t = table(("10.0.0.1", [("0", "192.1.27.6", "3"), ("1", "192.2.27.6", "2"), ("2", "192.3.27.6", "0"),
                            ("3", "192.4.27.6", "1")]))
    layout = parse_rank_table(t, SRC)
    assert [(s.rank, s.local_rank, s.device_id) for s in layout.ranks] == [(0, 0, 2), (1, 1, 3), (2, 2, 1), (3, 3, 0)]


# hccl_tools.py --device_num "[0,8)" on one Atlas 800 server: device IPs from /etc/hccn.conf's address_<id>,
# written with json.dump(indent=4) in this key order.
HCCL_TOOLS_8P = """{
    "version": "1.0",
    "server_count": "1",
    "server_list": [
        {
            "server_id": "10.155.111.140",
            "device": [
                {"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"},
                {"device_id": "1", "device_ip": "192.2.27.6", "rank_id": "1"},
                {"device_id": "2", "device_ip": "192.3.27.6", "rank_id": "2"},
                {"device_id": "3", "device_ip": "192.4.27.6", "rank_id": "3"},
                {"device_id": "4", "device_ip": "192.1.27.7", "rank_id": "4"},
                {"device_id": "5", "device_ip": "192.2.27.7", "rank_id": "5"},
                {"device_id": "6", "device_ip": "192.3.27.7", "rank_id": "6"},
                {"device_id": "7", "device_ip": "192.4.27.7", "rank_id": "7"}
            ],
            "host_nic_ip": "reserve"
        }
    ],
    "status": "completed"
}"""


def test_hccl_tools_eight_devices():
    layout = parse_rank_table(json.loads(HCCL_TOOLS_8P), SRC)
    assert layout.hosts == ("10.155.111.140",) and layout.nproc_per_node == 8
    assert [s.local_rank for s in layout.ranks] == list(range(8)) == [s.device_id for s in layout.ranks]


def test_merge_hccl_two_servers():
    # merge_hccl.py hccl_1.json hccl_2.json: servers in file order, the second one's devices ranks 8..15.
    one = json.loads(HCCL_TOOLS_8P)
    two = json.loads(HCCL_TOOLS_8P.replace("10.155.111.140", "10.155.111.141").replace(".27.", ".28."))
    for i, d in enumerate(two["server_list"][0]["device"]):
        d["rank_id"] = str(8 + i)
    merged = {"version": "1.0", "server_count": "2", "server_list": one["server_list"] + two["server_list"],
              "status": "completed"}
    layout = parse_rank_table(merged, SRC)
    assert layout.world_size == 16 and layout.ranks[9] == RankSlot(9, 1, 1, 1, "10.155.111.141")


def test_reads_what_the_writer_writes():
    ranks = plan_ranks(nnodes=2, nproc_per_node=3, device_type="cpu", master_addr="127.0.0.1", master_port=0,
                       cpu_count=2, extensions_dir="/tmp/x")
    written = json.loads(json.dumps(rank_table(ranks, ["node0", "node1"])))
    layout = parse_rank_table(written, SRC)
    assert layout.hosts == ("node0", "node1") and layout.nproc_per_node == 3
    assert [(s.rank, s.node_rank, s.local_rank) for s in layout.ranks] == [
        (r.rank, r.node_rank, r.local_rank) for r in ranks]
    one = parse_rank_table(rank_table(ranks[:3], ["127.0.0.1"]), SRC)
    assert one.hosts == ("127.0.0.1",) and one.world_size == 3


def test_duplicate_and_missing_rank():
    t = two_by_two()
    t["server_list"][1]["device"][1]["rank_id"] = "2"
    duplicate, missing = problems(t)
    assert 'server_list[1].device[1].rank_id="2": rank 2 is also server_list[1].device[0].rank_id' in duplicate
    assert "rank_id 3: no device has it; 4 devices take rank_ids 0..3, each once." in missing
    t["server_list"][1]["device"][1]["rank_id"] = "7"
    out_of_range, missing = problems(t)
    assert 'server_list[1].device[1].rank_id="7": out of range: 4 devices take rank_ids 0..3' in out_of_range
    assert "rank_id 3: no device has it" in missing


@pytest.mark.parametrize("address, why", [
    ("10.0.0.1;rm -rf /", "contains \";\""),
    ("$(id)", "contains \"$\""),
    ("`id`", "contains \"`\""),
    ("host name", "contains \" \""),
    ("'10.0.0.1'", "contains \"'\""),
    ("../../etc", "contains \"/\""),
    ("a..b", "neither an IP address nor a host name"),
    ("-oProxyCommand", "neither an IP address nor a host name"),
    ("10.0.0.256", "not a valid IPv4 address"),
    ("", "is empty"),
])
def test_addresses_refused(address, why):
    t = two_by_two()
    t["server_list"][0]["server_id"] = address
    t["server_list"][1]["device"][0]["device_ip"] = address
    server, device = problems(t)
    assert server.startswith(f"{SRC}: server_list[0].server_id={json.dumps(address)}: ") and why in server
    assert f"server_list[1].device[0].device_ip={json.dumps(address)}: " in device and why in device


@pytest.mark.parametrize("address", ["10.0.0.1", "fe80::1", "::1", "node-0.cluster.local", "localhost", "gpu_12"])
def test_addresses_taken(address):
    assert address_problem(address) == ""


def test_missing_fields():
    t = two_by_two()
    del t["status"]
    del t["server_list"][0]["server_id"]
    del t["server_list"][1]["device"][0]["rank_id"]
    status, server_id, rank_id = problems(t)
    assert 'the table has no "status". Add "status": "completed"' in status
    assert 'server_list[0] has no "server_id"' in server_id
    assert 'server_list[1].device[0] has no "rank_id". Add "rank_id": "0"' in rank_id


def test_numbers_instead_of_strings():
    t = two_by_two()
    t["server_count"] = 2
    t["server_list"][0]["device"][1]["rank_id"] = 1
    count, rank = problems(t)
    assert 'server_count=2: HCCL reads a string here, not a number' in count and 'Write "server_count": "2".' in count
    assert 'server_list[0].device[1].rank_id=1: ' in rank and 'Write "rank_id": "1".' in rank


def test_wrong_server_count_status_and_version():
    t = two_by_two()
    t["server_count"] = "3"
    t["status"] = "initializing"
    t["version"] = "1.2"
    version, status, count = problems(t)
    assert 'version="1.2": only rank tables of version 1.0 are read' in version
    assert 'status="initializing"' in status
    assert 'server_count="3": server_list has 2 servers. Write "server_count": "2".' in count


def test_device_listed_twice_on_a_server():
    t = two_by_two()
    t["server_list"][0]["device"][1]["device_id"] = "0"
    (p,) = problems(t)
    assert 'server_list[0].device[1].device_id="0": also server_list[0].device[0].device_id on this server' in p


def test_unequal_devices_per_server():
    t = table(("10.0.0.1", [("0", "192.1.27.6", "0"), ("1", "192.2.27.6", "1")]),
              ("10.0.0.2", [("0", "192.1.27.7", "2")]))
    (p,) = problems(t)
    assert "different numbers of devices (server_list[0]: 2, server_list[1]: 1)" in p


def test_interleaved_servers_refused():
    t = two_by_two()
    t["server_list"][0]["device"][1]["rank_id"] = "2"
    t["server_list"][1]["device"][0]["rank_id"] = "1"
    first, second = problems(t)
    assert "server_list[0] holds rank_ids 0, 2: each server's ranks must be one consecutive block" in first
    assert "Give server_list[1] rank_ids 2..3." in second


def test_unknown_keys_duplicate_servers_and_host_nic_ip():
    t = two_by_two()
    t["server_list"][1]["server_id"] = "10.0.0.1"
    t["server_list"][0]["host_nic_ip"] = "10.0.0.9"
    t["server_list"][0]["devices"] = []
    t["server_list"][1]["device"][0]["rank"] = "2"
    problems_ = problems(t)
    assert any('server_list[0].host_nic_ip="10.0.0.9": HCCL reserves this field' in p for p in problems_)
    assert any('server_list[0].devices=[]: no such key in a version 1.0 rank table. Did you mean "device"?' in p
               for p in problems_)
    assert any('server_list[1].device[0].rank="2": no such key' in p for p in problems_)
    assert any('server_list[1].server_id="10.0.0.1": also server_list[0].server_id' in p for p in problems_)


def test_every_problem_at_once_and_shapes():
    t = copy.deepcopy(two_by_two())
    t["server_list"][0]["device"][0]["rank_id"] = "01"
    t["server_list"][1]["device"] = []
    t["server_list"].append("10.0.0.3")
    found = problems(t)
    assert len(found) >= 3
    assert any('rank_id="01": must be a whole number >= 0' in p for p in found)
    assert any("server_list[1].device=[]: must be a non-empty list" in p for p in found)
    assert any('server_list[2]="10.0.0.3": a server is an object' in p for p in found)
    with pytest.raises(ConfigError, match="a rank table is a JSON object"):
        parse_rank_table([], SRC)  # type: ignore[arg-type]
