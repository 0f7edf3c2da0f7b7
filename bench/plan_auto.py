"""Planning time with placement=auto (issue 22): a wide_deep-like recipe with N tables and a 1 B-parameter dense
part on 4 hosts × 8 ranks, 80 GB devices, 1,024 GB hosts; plan_launch alone (no torch, no trace), the sizes
interleaved round by round, medians and spread.

    .venv/bin/python bench/plan_auto.py [--rounds 3] [--tables 10 1000 10000]
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

from omegaconf import open_dict

from launcher.config import compose_config
from launcher.backends import BACKENDS
from launcher.contract import Facts
from launcher.parallel import RULES
from launcher.plan import HostFacts, plan_launch
from launcher.recipes import RECIPES
from launcher.schema import TableConfig

CLUSTER = ["recipe=wide_deep", "placement=auto", "cluster.launch=elastic", "cluster.rdzv_endpoint=n0:29400",
           "cluster.nnodes=4", "cluster.nproc_per_node=8", "cluster.device_memory_gb=80", "cluster.host_memory_gb=1024"]


def config(n: int):
    """A recipe of n tables (5,000-15,000 rows × 64, lazy_adam and ftrl alternating) and 1e9 dense parameters."""
    RECIPES[f"bench_{n}"] = types.SimpleNamespace(
        tables=lambda m: {f"t{i}": (5_000 + 10 * (i % 1000), 64) for i in range(n)}, model_spec=lambda m, f: {},
        dense_param_count=lambda m: 1_000_000_000, problems=lambda *a: [], layer_names=lambda m: [])
    cfg = compose_config(CLUSTER)
    with open_dict(cfg):
        cfg.recipe.name = f"bench_{n}"
        cfg.tables = {f"t{i}": TableConfig(optimizer="lazy_adam" if i % 2 else "ftrl") for i in range(n)}
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tables", type=int, nargs="*", default=[10, 1000, 10000])
    args = ap.parse_args()
    host = HostFacts("bench", 2, 0, "/tmp/x")
    cfgs = {n: config(n) for n in args.tables}
    times: dict[int, list[float]] = {n: [] for n in args.tables}
    plans = {}
    for _ in range(args.rounds):
        for n, cfg in cfgs.items():
            t0 = time.perf_counter()
            facts = Facts(backends=tuple(BACKENDS.values()), parts=RULES, recipe=RECIPES[f"bench_{n}"])
            plans[n] = plan_launch(cfg, host, facts)
            times[n].append(time.perf_counter() - t0)
    for n, ts in times.items():
        on_host = sum(t.location == "host" for t in plans[n].placement.tables)
        print(f"{n:>6} tables: {statistics.median(ts) * 1000:7.0f} ms [{min(ts) * 1000:.0f}-{max(ts) * 1000:.0f}], "
              f"{on_host} tables on the host; {plans[n].decisions[0]}")


if __name__ == "__main__":
    main()
