"""cluster.rank_table_file / cluster.hostfile read before planning: the layout, or a ConfigError naming the key."""

import json

import pytest
from omegaconf import OmegaConf

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.facts.cluster_files import read_cluster_files
from launcher.plan.ranks import plan_ranks, rank_table
from launcher.schema import ClusterConfig


def cluster(**keys):
    return OmegaConf.create({"cluster": OmegaConf.structured(ClusterConfig(**keys))})


def test_nothing_given():
    assert read_cluster_files(cluster()) is None


def test_keys_in_the_schema():
    cfg = compose_config(["recipe=quickstart", "cluster.hostfile=hosts", "cluster.include=worker-0"])
    assert (cfg.cluster.hostfile, cfg.cluster.include, cfg.cluster.rank_table_file, cfg.cluster.exclude) == (
        "hosts", "worker-0", "", "")


def test_rank_table_file(tmp_path):
    ranks = plan_ranks(nnodes=2, nproc_per_node=2, device_type="cpu", master_addr="127.0.0.1", master_port=0,
                       cpu_count=2, extensions_dir="/tmp/x")
    path = tmp_path / "rank_table.json"
    path.write_text(json.dumps(rank_table(ranks, ["10.0.0.1", "10.0.0.2"]), indent=4))
    layout = read_cluster_files(cluster(rank_table_file=str(path)))
    assert layout.hosts == ("10.0.0.1", "10.0.0.2") and layout.world_size == 4
    assert layout.source == f"cluster.rank_table_file={path}"


def test_hostfile_filtered(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    layout = read_cluster_files(cluster(hostfile=str(path), exclude="worker-0"))
    assert layout.hosts == ("worker-1",) and [s.device_id for s in layout.ranks] == [0, 1]


def test_file_problems_name_the_key(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=f"cluster.rank_table_file={missing}: no such file"):
        read_cluster_files(cluster(rank_table_file=str(missing)))
    with pytest.raises(ConfigError, match=f"cluster.hostfile={tmp_path}: a folder, not a file"):  # was "no such file"
        read_cluster_files(cluster(hostfile=str(tmp_path)))
    bad = tmp_path / "bad.json"
    bad.write_text("{'version': '1.0'}")
    with pytest.raises(ConfigError, match=f"cluster.rank_table_file={bad}: not JSON"):
        read_cluster_files(cluster(rank_table_file=str(bad)))
    binary = tmp_path / "hosts"
    binary.write_bytes(b"\xff\xfe worker-0 slots=2")
    with pytest.raises(ConfigError, match=f"cluster.hostfile={binary}: cannot be read"):
        read_cluster_files(cluster(hostfile=str(binary)))
    bad.write_text('{"version": "1.0", "server_count": "1", "server_list": [], "status": "completed"}')
    with pytest.raises(ConfigError, match=rf"cluster.rank_table_file={bad}: server_list=\[\]: must be a non-empty"):
        read_cluster_files(cluster(rank_table_file=str(bad)))


def test_combinations_refused():
    with pytest.raises(ConfigError, match="cluster.rank_table_file=a.json and cluster.hostfile=hosts: give one"):
        read_cluster_files(cluster(rank_table_file="a.json", hostfile="hosts"))
    with pytest.raises(ConfigError, match="cluster.include=worker-0 filters the hosts of cluster.hostfile"):
        read_cluster_files(cluster(include="worker-0"))
