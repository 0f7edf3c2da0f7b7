"""How long a lost host costs: hosts with network stacks of their own (tests/hosts.py: network namespaces on a
bridge; root only), each running hetero-launch's wide_deep smoke job with 1 rank, the last host's link cut mid-run.

    sudo .venv/bin/python bench/lost_host_bench.py [--hosts 2,3] [--heartbeat 30] [--kinds static,elastic,etcd]
                                                 [--out bench/results/lost_host.txt]

- ``static`` (cluster.nnodes=N): seconds from the cut to each launcher's exit, and the silence each host recorded
  before naming the other lost (summary.json's ``first_failure.silent_s``);
- ``elastic`` (cluster.nnodes=1:N, launcher.max_restarts=1, checkpoints every 10 steps in a shared folder): the
  first host's time lost by the restart (``attempts[1].time_lost_s``: from the cut host's failure to the first step
  of the next attempt) and the cut host's exit after the cut.
- ``etcd`` (N >= 3: cluster.nnodes=2:N on torch's etcd-v2 rendezvous, an etcd member on each host, each launcher
  asking its own; restarts as elastic): the link of the *first* host is cut, the one whose launcher would hold a
  c10d store (and holds the ranks' store of the round as node 0): the time lost by the others' restart, read from
  the second host's summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.hosts import Hosts, etcd_missing, last_step, missing  # noqa: E402

BASE = ["recipe=wide_deep", "smoke=true", "trainer.log_every=1", "eval.batches=0", "batch.global_size=96"]
"""96 samples a step: 1, 2 and 3 hosts of one rank divide it."""


def scenario(n: int, kind: str, heartbeat: float, port: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lost_host_"))
    with Hosts(n) as hosts:
        nnodes = {"elastic": f"1:{n}", "etcd": f"2:{n}"}.get(kind, str(n))
        endpoint = f"{hosts.addrs[0]}:{port}"
        if kind == "etcd":
            hosts.etcd()
            endpoint = "127.0.0.1:2379"
        args = [*BASE, "cluster.launch=elastic", f"cluster.nnodes={nnodes}", "cluster.nproc_per_node=1",
                f"cluster.rdzv_endpoint={endpoint}", f"cluster.rdzv_id=bench{port}",
                f"cluster.heartbeat_timeout_s={heartbeat:g}"]
        if kind == "etcd":
            args += ["cluster.rdzv_backend=etcd-v2"]
        if kind in ("elastic", "etcd"):
            args += ["trainer.steps=80", "trainer.checkpoint_every=10", f"trainer.checkpoint_dir={tmp / 'shared'}",
                     "launcher.max_restarts=1", "+cluster.rdzv_conf.last_call_timeout=2"]
        else:
            args += ["trainer.steps=100000", "trainer.checkpoint_every=-1"]
        procs = []
        for i in range(n):
            (tmp / hosts.names[i]).mkdir()
            procs.append(hosts.run(i, [sys.executable, "-m", "launcher.cli", *args], cwd=tmp / hosts.names[i],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "COLUMNS": "200"}))
        run0 = tmp / "h0" / "log_output" / "latest"
        while last_step(run0) < 22:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a launcher ended before the cut: {[p.returncode for p in procs]}")
            time.sleep(0.1)
        victim = 0 if kind == "etcd" else n - 1
        hosts.cut(victim)
        cut = time.monotonic()
        exits: list[float | None] = [None] * n
        while None in exits and time.monotonic() - cut < 600:
            for i, p in enumerate(procs):
                if exits[i] is None and p.poll() is not None:
                    exits[i] = round(time.monotonic() - cut, 1)
            time.sleep(0.05)
    summaries = [json.loads((tmp / h / "log_output" / "latest" / "summary.json").read_text()) for h in hosts.names]
    out = {"hosts": n, "kind": kind, "heartbeat_s": heartbeat, "exit_after_cut_s": exits,
           "exit_codes": [p.returncode for p in procs]}
    if kind == "static":
        out["silent_s"] = [s.get("first_failure", {}).get("silent_s") for s in summaries]
    else:
        survivor = summaries[1 if victim == 0 else 0]
        out["time_lost_s"] = survivor["attempts"][1].get("time_lost_s")
        out["resumed_step"] = survivor["attempts"][1].get("resumed_step")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="2,3")
    ap.add_argument("--heartbeat", type=float, default=30.0)
    ap.add_argument("--kinds", default="static,elastic,etcd")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if why := missing():
        sys.exit(f"lost_host_bench: {why}")
    port = 29500
    lines = [f"# lost_host_bench heartbeat {args.heartbeat:g} s, {time.strftime('%Y-%m-%d %H:%M')}"]
    for n in (int(x) for x in args.hosts.split(",")):
        for kind in args.kinds.split(","):
            if kind == "etcd" and (n < 3 or etcd_missing()):
                print(f"etcd with {n} hosts: skipped ({etcd_missing() or 'an etcd cluster of 2 loses its quorum with one'})")
                continue
            port += 1
            result = scenario(n, kind, args.heartbeat, port)
            lines.append(json.dumps(result))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
