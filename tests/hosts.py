"""Hosts with network stacks of their own, for multi-host tests: Linux network namespaces on one bridge.

``Hosts(n)`` makes a namespace ``<tag>-sw`` holding a bridge, and for each host ``<tag>-h<i>`` a namespace joined to
the bridge by a veth pair made inside the two namespaces (nothing is added to the test machine's own network), with
the address ``10.<a>.<b>.<10 + i>/24`` (a private range, drawn per instance) on its ``eth0`` and its loopback up.
``run(i, argv)`` starts a command on host i: in its namespace, under ``unshare --uts --mount`` with hostname
``h<i>`` and an ``/etc/hosts`` that names every host by its address (bind-mounted in that mount namespace only), so
``socket.getfqdn()`` and name lookups behave as on separate machines. ``cut(i)`` takes host i's link down (packets
are dropped, no connection is reset: a cable pulled), ``shape(i, ...)`` puts netem on it, ``limit(i, rate)`` a
token bucket (where the kernel has no netem). ``etcd()`` starts an etcd cluster of one member per host (the store of
cluster.rdzv_backend=etcd-v2); ``rsh_agent()`` is mpirun's way onto the hosts, as ssh would be. ``close()`` kills what
is left in the namespaces and removes them, which removes their links.

Needs root and ``ip``, ``unshare``; ``missing()`` says why not, for a skip (``etcd_missing()`` for etcd)."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def missing() -> str:
    """Why namespaced hosts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "namespaced hosts need root (ip netns, unshare --mount)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"namespaced hosts need {tool}"
    probe = f"hlprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def etcd_missing() -> str:
    """Why an etcd cluster cannot back a rendezvous here ('' when it can): the server (Debian's etcd-server) and
    the client torch's etcd-v2 backend imports (python-etcd)."""
    import importlib.util

    if shutil.which("etcd") is None:
        return "no etcd server here (Debian: apt-get install etcd-server)"
    if importlib.util.find_spec("etcd") is None:
        return "no python-etcd here (pip install python-etcd), which torch's etcd-v2 rendezvous imports"
    return ""


def last_step(run: Path) -> int:
    """The last step any rank of a run dir logged (0 before the first)."""
    best = 0
    for metrics in run.glob("rank.*/metrics.jsonl"):
        for line in metrics.read_text().splitlines()[-3:]:
            try:
                best = max(best, int(json.loads(line).get("step", 0)))
            except ValueError:
                pass
    return best


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")


class Hosts:
    def __init__(self, n: int, loopback_names: bool = False) -> None:
        """``loopback_names``: each host's /etc/hosts names itself 127.0.1.1 (Debian's line, many containers) and
        the others by their addresses."""
        self.tag = f"hl{os.getpid() % 10000}{random.randrange(100, 1000)}"
        self.net = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.names = [f"h{i}" for i in range(n)]
        self.addrs = [f"{self.net}.{10 + i}" for i in range(n)]
        self.switch = f"{self.tag}-sw"
        self.spaces = [f"{self.tag}-h{i}" for i in range(n)]
        self.loopback_names = loopback_names
        self._dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self._procs: list[subprocess.Popen] = []
        try:
            self._make()
        except Exception:
            self.close()
            raise

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for i, me in enumerate(self.names):
            lines = ["127.0.0.1 localhost"] + [f"{'127.0.1.1' if h == me and self.loopback_names else a} {h}"
                                               for a, h in zip(self.addrs, self.names)]
            (self._dir / f"hosts{i}").write_text("\n".join(lines) + "\n")
        for i, ns in enumerate(self.spaces):
            _ip("netns", "add", ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            _ip("link", "set", f"p{i}", "master", "br0", "up", ns=self.switch)
            _ip("addr", "add", f"{self.addrs[i]}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)

    def command(self, i: int, argv: list[str]) -> list[str]:
        """argv as host i runs it (its namespace, hostname and /etc/hosts)."""
        setup = f'hostname {self.names[i]} && mount --bind {self._dir / f"hosts{i}"} /etc/hosts && exec "$@"'
        return ["ip", "netns", "exec", self.spaces[i], "unshare", "--uts", "--mount", "sh", "-c", setup, "sh", *argv]

    def rsh_agent(self) -> str:
        """A remote shell for OpenMPI (``--mca plm_rsh_agent <it>``), as ssh is called: ``<agent> <host> <command>``
        runs the command on that namespaced host (its namespace, hostname and /etc/hosts), so mpirun starts its
        daemons on the hosts of its --host list as it would over ssh."""
        cases = [f'  {name}) exec {shlex.join(self.command(i, ["sh", "-c"]))} "$*" ;;'  # run's setup, then the command
                 for i, name in enumerate(self.names)]
        agent = self._dir / "rsh"
        agent.write_text("\n".join(["#!/bin/sh", 'host="$1"; shift', 'case "$host" in', *cases,
                                     '  *) echo "no host $host" >&2; exit 255 ;;', "esac", ""]))
        agent.chmod(0o755)
        return str(agent)

    def run(self, i: int, argv: list[str], **popen) -> subprocess.Popen:
        """Start argv on host i (its own process group: close() ends what it leaves)."""
        p = subprocess.Popen(self.command(i, argv), start_new_session=True, **popen)
        self._procs.append(p)
        return p

    def cut(self, i: int) -> None:
        """Host i's link down: its packets go nowhere, no connection is reset."""
        _ip("link", "set", "eth0", "down", ns=self.spaces[i])

    def shape(self, i: int, *netem: str) -> None:
        """netem on host i's link (e.g. 'rate', '20mbit', 'delay', '50ms')."""
        self._qdisc(i, "netem", *netem)

    def limit(self, i: int, rate: str) -> None:
        """Host i's link limited to ``rate`` (e.g. '20mbit') by a token bucket (tbf), where netem is missing."""
        self._qdisc(i, "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")

    def _qdisc(self, i: int, *qdisc: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.spaces[i], "tc", "qdisc", "add", "dev", "eth0", "root", *qdisc],
                       check=True, capture_output=True)

    def can_shape(self, kind: str = "netem") -> str:
        """Why links cannot be shaped here by ``kind`` (netem, tbf) ('' when they can)."""
        args = ["delay", "1ms"] if kind == "netem" else ["rate", "1mbit", "burst", "32kbit", "latency", "400ms"]
        res = subprocess.run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", "p0", "root", kind,
                              *args], capture_output=True, text=True)
        if res.returncode != 0:
            return f"tc {kind} is not available here: {res.stderr.strip() or res.stdout.strip()}"
        subprocess.run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "del", "dev", "p0", "root"],
                       capture_output=True)
        return ""

    def etcd(self, port: int = 2379, timeout_s: float = 60.0) -> None:
        """An etcd cluster with one member on each host (its v2 API on, as torch's etcd-v2 backend speaks it): clients
        reach a host's member at 127.0.0.1:``port`` on that host, or at its address; members talk on ``port`` + 1.
        Returns once every member answers. A cluster of three keeps its quorum when one host is lost."""
        peers = ",".join(f"e{i}=http://{a}:{port + 1}" for i, a in enumerate(self.addrs))
        for i, addr in enumerate(self.addrs):
            log = open(self._dir / f"etcd{i}.log", "w")
            self._procs.append(subprocess.Popen(
                ["ip", "netns", "exec", self.spaces[i], "etcd", "--name", f"e{i}", "--enable-v2=true",
                 "--data-dir", str(self._dir / f"etcd{i}"), "--initial-cluster", peers,
                 "--initial-cluster-token", self.tag, "--initial-cluster-state", "new",
                 "--listen-peer-urls", f"http://{addr}:{port + 1}",
                 "--initial-advertise-peer-urls", f"http://{addr}:{port + 1}",
                 "--listen-client-urls", f"http://127.0.0.1:{port},http://{addr}:{port}",
                 "--advertise-client-urls", f"http://{addr}:{port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        probe = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/v2/keys', timeout=2)"
        deadline = time.monotonic() + timeout_s
        for i in range(len(self.addrs)):
            while subprocess.run(["ip", "netns", "exec", self.spaces[i], sys.executable, "-c", probe],
                                 capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd on h{i} did not answer within {timeout_s:g} s: "
                                       + (self._dir / f"etcd{i}.log").read_text()[-2000:])
                time.sleep(0.5)

    def pids(self, i: int) -> list[int]:
        """The processes in host i's network namespace."""
        res = subprocess.run(["ip", "netns", "pids", self.spaces[i]], capture_output=True, text=True)
        return [int(p) for p in res.stdout.split()]

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for ns in [*self.spaces, self.switch]:
            for pid in (self.pids(self.spaces.index(ns)) if ns in self.spaces else []):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
