"""Several hosts on torch elastic's c10d rendezvous (cluster.launch=elastic), as torchrun --rdzv-backend=c10d does.

Every host runs the same command. The launchers meet at ``cluster.rdzv_endpoint`` through torch's own rendezvous
handler (``get_rendezvous_handler``, backend c10d): it assigns each host its node rank; node 0's launcher hosts the
store the ranks bootstrap their process group on, a new one each round. Each round of the
rendezvous (the first, and one after each failure, lost host or host waiting to join: ``launcher.launch.
elastic_agent``) has its own store, which carries what the launchers tell each other, under ``hl/``:

- ``host/<node>``: each node's address, facts (cores, devices, available memory) and launcher, for the checks and
  the run's rank table;
- ``plan/<node>``: a hash of each node's plan; every node checks it got the same plan before any rank starts;
- ``master``: the address of the store node 0 hosts for the round's ranks;
- ``failed``: the first failure, written once (compare_set): every launcher stops its ranks and names the same rank
  (or ``{"admit": N}``: a host waits to join, and the round ends to admit it);
- ``finished/<node>``: no launcher leaves (and takes a store with it) before every node is done;
- ``beat/<node>``: each launcher's heartbeat (launcher/launch/liveness.py): a node silent for
  cluster.heartbeat_timeout_s is named lost on every other node, and a host the store does not answer for that long
  leaves the job. While ranks run, only the liveness thread calls the store."""

from __future__ import annotations

import json
import socket
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from omegaconf import DictConfig

from launcher.backends.elastic import RDZV_BACKENDS
from launcher.errors import ConfigError
from launcher.launch.liveness import FAILED_KEY, Liveness, Silence
from launcher.plan import HostFacts, RunPlan
from launcher.plan.layout import endpoint_host
from launcher.plan.ranks import on_node
from launcher.metrics_writer import host_available_memory

_PREFIX = "hl/"
POLL_S = 0.5
"""How often a launcher looks for another node's failure."""
LOST_PEER_WAIT_S = 3.0
"""A node whose ranks only lost their peers waits this long for the node with the cause to speak first."""
ADMIT_POLL_S = 1.0
"""How often a launcher asks the rendezvous whether a host waits to join."""
FIRST_WRITE_WAIT_S = 10.0
"""How long a node that lost the claim to the round's first failure waits for the winner's record (etcd-v2)."""
FINISH_WAIT_S = 30.0
"""How long a launcher waits at the end for the other nodes to be done with the stores."""


def plan_hash(plan: RunPlan) -> str:
    """What every node must agree on: the plan without its per-host parts (rank env: cores, cache paths; notes).
    `hetero-launch report` checks gathered run dirs with the same digest of their plan.json."""
    from launcher.report.merge import plan_digest

    return plan_digest(plan.to_dict())


@dataclass
class NodeGroup:
    node_rank: int
    nnodes: int
    master_addr: str
    """The ranks' bootstrap store (on node 0)."""
    master_port: int
    hosts: list[dict[str, Any]]
    """Each node's address and facts, by node rank."""
    store: Any
    handler: Any
    admit: bool = False
    """A host waiting to join stops this round (launcher.max_restarts left and fewer than MAX hosts)."""
    liveness: Liveness | None = None
    """The heartbeats between the round's launchers (started by ``agree``)."""
    endpoint: str = ""
    """cluster.rdzv_endpoint: where the store is."""
    ranks: dict[int, list[int]] | None = None
    """node -> its global ranks, for naming a lost host."""
    _checked: float = 0.0
    _waiting_checked: float = 0.0

    def _key(self, name: str) -> str:
        return _PREFIX + name

    @property
    def store_lost(self) -> bool:
        """The store has not answered this host for the heartbeat timeout: it is not called again."""
        return self.liveness is not None and self.liveness.store_lost

    def publish_failure(self, failure: dict[str, Any], lost_peer: bool) -> dict[str, Any]:
        """Tell every node about this node's first failure, unless another node spoke first; returns the failure
        every node names. A failure that is only a lost peer waits a little for the node with the cause."""
        if self.store_lost:
            return {**failure, "node": failure.get("node", self.node_rank)}
        if lost_peer:
            deadline = time.monotonic() + LOST_PEER_WAIT_S
            while time.monotonic() < deadline:
                theirs = self.remote_failure(force=True)
                if theirs is not None:
                    return theirs
                time.sleep(0.1)
        payload = json.dumps({"node": self.node_rank, **failure})
        try:
            won = first_write(self.store, FAILED_KEY, payload)
            return json.loads(won.decode() if isinstance(won, bytes) else won)
        except (RuntimeError, ValueError, OSError, LookupError):  # the store is gone, or etcd timed out: ours stands
            return {"node": self.node_rank, **failure}

    def remote_failure(self, force: bool = False) -> dict[str, Any] | None:
        """The failure another node published, if any: what the liveness thread read (while ranks run, and once the
        store is lost), else looked up at most every POLL_S."""
        if self.liveness is not None and (not force or self.store_lost):
            return self.liveness.failure
        now = time.monotonic()
        if not force and now - self._checked < POLL_S:
            return None
        self._checked = now
        try:
            if not self.store.check([FAILED_KEY]):
                return None
            return json.loads(self.store.get(FAILED_KEY))
        except (RuntimeError, ValueError, OSError):
            return None

    def should_stop(self) -> bool:
        """The ranks of this round stop: another node published a failure, or (with ``admit``) a host waits to join
        (``num_nodes_waiting() > 0``, which torch's agent checks in its monitor loop): this node then publishes the
        admission as the round's end, so that every node names the same cause."""
        if self.remote_failure() is not None:
            return True
        if self.liveness is not None:  # (the thread asks the handler whether a host waits)
            return self.liveness.silence() is not None or (self.admit and self.liveness.waiting > 0)
        now = time.monotonic()
        if not self.admit or now - self._waiting_checked < ADMIT_POLL_S:
            return False
        self._waiting_checked = now
        try:
            waiting = self.handler.num_nodes_waiting()
        except Exception:  # noqa: BLE001 - torch's handler raises what its store raised; a lost store ends the round
            return False
        if waiting <= 0:
            return False
        self.publish_failure({"admit": waiting}, lost_peer=False)
        return True

    def round_end(self) -> dict[str, Any] | None:
        """Why this node's ranks were stopped from outside (``should_stop``), as every node names it: a lost host or
        store (published, so that the others name the same), a host waiting to join (published as the round's end),
        or the failure another node published."""
        silence = self.liveness.silence() if self.liveness is not None else None
        if silence is not None:
            return self.publish_failure(self.lost_failure(silence), lost_peer=False)
        if self.liveness is not None and self.admit and self.liveness.waiting > 0 and \
                self.remote_failure(force=True) is None:
            return self.publish_failure({"admit": self.liveness.waiting}, lost_peer=False)
        return self.remote_failure(force=True)

    def lost_failure(self, silence: Silence) -> dict[str, Any]:
        """The failure record of a silence: the hosts lost (node, hostname, address, ranks) and what this node saw."""
        timeout = self.liveness.timeout_s if self.liveness is not None else 0
        if silence.store:
            host = endpoint_host(self.endpoint)
            holders = [n for n in silence.nodes if host in (self.hosts[n]["addr"], self.hosts[n]["hostname"])]
            nodes = holders or list(silence.nodes)
        else:
            nodes = list(silence.nodes)
        lost = [{"node": n, "hostname": self.hosts[n]["hostname"], "addr": self.hosts[n]["addr"],
                 "ranks": (self.ranks or {}).get(n, [])} for n in nodes]
        named = "; ".join(_host_words(h) for h in lost)
        if silence.store:
            error = (f"the rendezvous store at cluster.rdzv_endpoint={self.endpoint} has not answered this host for "
                     f"{silence.silent_s:g} s (cluster.heartbeat_timeout_s={timeout:g}): this host is cut off from "
                     f"{named}, or that host is lost. This host's ranks were stopped and it leaves the job.")
        else:
            error = (f"{named} {'has' if len(lost) == 1 else 'have'} not been heard from for {silence.silent_s:g} s "
                     f"(cluster.heartbeat_timeout_s={timeout:g}): lost (its launcher is gone or its network is "
                     f"cut). This host's ranks were stopped.")
        return {"node": nodes[0], "rank": None, "lost": lost, "store_lost": silence.store,
                "seen_by": self.node_rank, "silent_s": silence.silent_s, "last_heard": time.time() - silence.silent_s,
                "error": error}

    def close(self) -> None:
        """The round is over for this node: no more heartbeats (the next round's handler calls are this thread's)."""
        if self.liveness is not None:
            self.liveness.stop(join=True)

    def finish(self) -> None:
        """Say this node is done and wait (at most FINISH_WAIT_S) until every node still heard from is: the
        rendezvous store lives in one of the launchers (whichever bound cluster.rdzv_endpoint first), and the others
        may still need it to learn who failed first. A host the store no longer answers leaves at once."""
        silence = self.liveness.silence() if self.liveness is not None else None
        if silence is not None and silence.store:
            self.close()
            return
        gone = set(silence.nodes) if silence is not None else set()
        with suppress(RuntimeError, OSError):
            self.store.set(self._key(f"finished/{self.node_rank}"), "1")
            keys = [self._key(f"finished/{n}") for n in range(self.nnodes) if n not in gone]
            self.store.wait(keys, timedelta(seconds=FINISH_WAIT_S))
        self.close()
        with suppress(Exception):  # torch's handler may fail on a store already gone; nothing is left to do
            self.handler.shutdown()


def first_write(store: Any, key: str, value: str) -> bytes | str:
    """``value`` written at ``key`` unless another node wrote first; returns what the key holds (the first write).
    A TCPStore compares and sets; torch's EtcdStore has no compare_set: there an ``add`` to ``<key>/claim`` says who
    is first (etcd's own atomic compare-and-swap), and the others read what the first wrote, waiting for it at most
    FIRST_WRITE_WAIT_S."""
    try:
        return store.compare_set(key, "", value)
    except RuntimeError as e:
        if "Not implemented" not in str(e):
            raise
    if store.add(f"{key}/claim", 1) == 1:
        store.set(key, value)
        return value
    store.wait([key], timedelta(seconds=FIRST_WRITE_WAIT_S))  # a first writer lost before it wrote: LookupError
    return store.get(key)


def _host_words(host: dict[str, Any]) -> str:
    ranks = ", ".join(map(str, host["ranks"])) or "none"
    addr = f"{host['addr']}; " if host["addr"] != host["hostname"] else ""
    return f"host {host['hostname']} ({addr}node {host['node']}, ranks {ranks})"


def memory_problems(plan: RunPlan, hosts: list[dict[str, Any]]) -> list[str]:
    """Hosts whose available memory is below what the plan's estimate puts on each host (its ranks' parameters,
    gradients, optimizer states and tables in host memory; on CPU ranks the device's share too). The estimate leaves
    out activations and the framework itself: a host below it cannot run the plan."""
    memory = getattr(plan, "memory", None)
    if memory is None:
        return []
    per_rank = memory.host.total + (memory.device.total if plan.device_type == "cpu" else 0)
    need = per_rank * plan.nproc_per_node
    short = [h for h in hosts if 0 < h.get("mem_available", 0) < need]
    if not short:
        return []
    gib = 2**30
    listed = ", ".join(f"node {h['node']} ({h['hostname']}) {h['mem_available'] / gib:.1f} GiB" for h in short)
    return [f"cluster.nproc_per_node={plan.nproc_per_node}: the plan puts {need / gib:.1f} GiB on each host "
            f"({plan.nproc_per_node} rank(s) × {per_rank / gib:.1f} GiB of parameters, gradients, optimizer states "
            f"and tables: the plan's memory estimate), but {listed} available. Use fewer ranks per host, a higher "
            f"zero.stage (shards the states), or hosts with more memory."]


def next_round(handler, cfg: DictConfig, host: HostFacts, attempts: int, identity: str):
    """Meet the other hosts in the rendezvous' next round (``handler.next_rendezvous()``, as torch's agent does on
    every restart; waits up to cluster.rdzv_timeout_s). Each host says who it is (address, facts, its launcher) and
    how many attempts it made; returns (RendezvousInfo, hosts by node rank, the round's attempt number: the most any
    host made, so that a host that joins late counts on from the others). RuntimeError (exit 1) for a rendezvous
    that did not complete or was closed (the job ended)."""
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousError,
                                                           RendezvousTimeoutError)

    c = cfg.cluster
    addr = c.local_addr or socket.getfqdn()  # as the other hosts reach this one
    try:
        info = handler.next_rendezvous()
    except RendezvousClosedError:
        kept = " (etcd keeps a job's rendezvous after it: give each job its own cluster.rdzv_id)" if \
            RDZV_BACKENDS[str(c.rdzv_backend)].etcd else ""
        raise RuntimeError(f"the job at cluster.rdzv_endpoint={c.rdzv_endpoint} (cluster.rdzv_id={c.rdzv_id}) has "
                           f"ended (its rendezvous is closed): this host ({addr}) came too late to join"
                           f"{kept}.") from None
    except RendezvousTimeoutError:
        raise RuntimeError(f"not every node joined the rendezvous at cluster.rdzv_endpoint={c.rdzv_endpoint} "
                           f"(cluster.rdzv_id={c.rdzv_id}) within cluster.rdzv_timeout_s={c.rdzv_timeout_s:g} s: this "
                           f"host ({addr}) did, cluster.nnodes={c.nnodes} were expected. "
                           f"Start the same command on every host (the same rdzv_endpoint and rdzv_id).") from None
    except (RendezvousError, RuntimeError, TimeoutError, OSError) as e:
        raise RuntimeError(f"the rendezvous at cluster.rdzv_endpoint={c.rdzv_endpoint} (cluster.rdzv_id="
                           f"{c.rdzv_id}) did not complete: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                           f". All cluster.nnodes={c.nnodes} hosts must run the same command within "
                           f"cluster.rdzv_timeout_s={c.rdzv_timeout_s:g} s.") from None
    store, node, nnodes = info.store, info.rank, info.world_size
    store.set(_PREFIX + f"host/{node}", json.dumps({"node": node, "addr": addr, "hostname": host.hostname,
                                                    "launcher": identity, "attempts": attempts,
                                                    "cpu_count": host.cpu_count, "accelerators": host.accelerators,
                                                    "mem_available": host_available_memory()}))
    hosts = [json.loads(store.get(_PREFIX + f"host/{n}")) for n in range(nnodes)]
    return info, hosts, max(h["attempts"] for h in hosts)


def agree(info, hosts: list[dict[str, Any]], handler, plan: RunPlan, ranks_store, cluster: Any = None,
          admit: bool = False) -> NodeGroup:
    """Check that every node of the round planned the same run and can hold it; returns the round's NodeGroup, whose
    ranks meet at ranks_store (node 0's, given there; the others read its address from the round's store), its
    heartbeats started (``cluster``: heartbeat_timeout_s, rdzv_endpoint). ConfigError for a plan that differs or
    hosts that cannot run it."""
    store, node, nnodes = info.store, info.rank, info.world_size
    if node == 0:
        store.set(_PREFIX + "master", f"{hosts[0]['addr']}:{ranks_store.port}")
    master_addr, _, master_port = store.get(_PREFIX + "master").decode().rpartition(":")
    store.set(_PREFIX + f"plan/{node}", plan_hash(plan))
    hashes = [store.get(_PREFIX + f"plan/{n}").decode() for n in range(nnodes)]
    group = NodeGroup(node_rank=node, nnodes=nnodes, master_addr=master_addr, master_port=int(master_port),
                      hosts=hosts, store=store, handler=handler, admit=admit,
                      endpoint=str(cluster.rdzv_endpoint) if cluster is not None else "",
                      ranks={n: [r.rank for r in on_node(plan.ranks, n)] for n in range(nnodes)})
    problems = []
    if len(set(hashes)) > 1:
        differ = [f"node {n} ({hosts[n]['hostname']}) {h}" for n, h in enumerate(hashes)]
        problems.append(f"the nodes planned different runs (plan hashes: {', '.join(differ)}): every host must run "
                        f"the same command with the same config and code. Compare their plan.json (dry_run=true).")
    if plan.device_type == "cuda":
        short = [f"node {h['node']} ({h['hostname']}: {h['accelerators']})" for h in hosts
                 if h["accelerators"] < plan.nproc_per_node]
        if short:
            problems.append(f"cluster.nproc_per_node={plan.nproc_per_node} CUDA devices per host, but "
                            f"{', '.join(short)} have fewer. Lower cluster.nproc_per_node.")
    problems += memory_problems(plan, hosts)
    if problems:
        group.finish()
        raise ConfigError(problems)
    if cluster is not None and nnodes > 1:  # every node got here (the hashes above wait for all): beat from now on
        group.liveness = Liveness(store, node, nnodes, float(cluster.heartbeat_timeout_s), handler, admit).start()
    return group
