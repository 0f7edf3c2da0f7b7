"""The cluster a run is given in a file: cluster.rank_table_file (a MindSpore/HCCL rank table) or cluster.hostfile
(OpenMPI's and DeepSpeed's ``<host> slots=<N>`` lines, filtered by cluster.include/exclude). Read here, by the
backends (``Backend.layout``), before the plan: the plan gets the resulting ClusterLayout, and the parsing itself
is pure (launcher/plan/hccl_table.py, launcher/plan/hostfile.py)."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from launcher.errors import ConfigError
from launcher.plan.hccl_table import parse_rank_table
from launcher.plan.hostfile import filter_hosts, hostfile_layout, parse_hostfile
from launcher.plan.layout import ClusterLayout

__all__ = ["read_cluster_files"]


def read_cluster_files(cfg: DictConfig) -> ClusterLayout | None:
    """The ClusterLayout that cluster.rank_table_file or cluster.hostfile (filtered by cluster.include/exclude)
    describes, or None when neither is given. A missing, unreadable or malformed file is a ConfigError naming the
    key; the parsing itself is pure (launcher/plan/hccl_table.py, launcher/plan/hostfile.py)."""
    c = cfg.cluster
    table, hostfile = str(c.get("rank_table_file", "")), str(c.get("hostfile", ""))
    include, exclude = str(c.get("include", "")), str(c.get("exclude", ""))
    if table and hostfile:
        raise ConfigError(f"cluster.rank_table_file={table} and cluster.hostfile={hostfile}: give one description "
                          f"of the cluster. Keep one of them and set the other to ''.")
    if (include or exclude) and not hostfile:
        key, value = ("cluster.include", include) if include else ("cluster.exclude", exclude)
        raise ConfigError(f"{key}={value} filters the hosts of cluster.hostfile, which is not given. Set "
                          f"cluster.hostfile=<path> or remove {key}.")
    if table:
        key = f"cluster.rank_table_file={table}"
        try:
            obj = json.loads(_cluster_file(key, table))
            return parse_rank_table(obj, key)  # its messages quote values (json.dumps): deep ones recurse there too
        except ValueError as e:
            raise ConfigError(f"{key}: not JSON ({e}). Give a rank table as hccl_tools.py writes it.") from None
        except RecursionError:
            raise ConfigError(f"{key}: its JSON is nested too deeply to read (Python's parser recurses once per "
                              "level). A rank table is 4 levels deep: {\"server_list\": [{\"device\": [{...}]}]}. Give "
                              "a rank table as hccl_tools.py writes it.") from None
    if hostfile:
        key = f"cluster.hostfile={hostfile}"
        hosts = parse_hostfile(_cluster_file(key, hostfile), key)
        return hostfile_layout(filter_hosts(hosts, include, exclude, source=key), key)
    return None


def _cluster_file(key: str, path: str) -> str:
    """The text of a cluster file, or a ConfigError naming key."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{key}: a folder, not a file. Give the path of the file itself.")
    if not p.is_file():
        raise ConfigError(f"{key}: no such file (relative paths start at {Path.cwd()}). Give the path of the file.")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}: cannot be read ({e}). Make it a readable UTF-8 text file.") from None
