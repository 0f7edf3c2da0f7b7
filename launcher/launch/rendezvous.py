"""torch's rendezvous handler of an elastic job (``get_rendezvous_handler``, as torchrun builds it), made where the
launcher can bound the wait: torch's store client may wait inside C++ with no bound, where no signal reaches Python
(launcher/launch/nodes.py uses the handler for each round)."""

from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig

from launcher.backends.elastic import RDZV_BACKENDS
from launcher.errors import first_line
from launcher.plan.layout import endpoint_host

READ_TIMEOUT_S = 60
"""torch's c10d rendezvous backend's default read_timeout (its store client's connect and call bound), in s."""


def _is_host(endpoint: str, local_addr: str) -> dict[str, str]:
    """torch's ``is_host`` setting, where its own guess would be wrong: the endpoint is this host's cluster.local_addr
    but its name does not resolve to it (a name on 127.0.1.1), so no launcher would hold the store. Elsewhere torch
    guesses (and falls back to a client when the port is taken: several launchers on one machine)."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    host = endpoint_host(endpoint)
    return {"is_host": "true"} if local_addr and local_addr == host and not _matches_machine_hostname(host) else {}


def rendezvous_handler(cfg: DictConfig):
    """torch's rendezvous handler of this job (``get_rendezvous_handler``, as torchrun builds it, on
    cluster.rdzv_backend: c10d or etcd-v2): rounds of MIN to MAX hosts (cluster.nnodes), with cluster.rdzv_conf's
    settings (last call, keep-alive) passed on."""
    from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from launcher.plan.nodes import node_range

    c = cfg.cluster
    lo, hi = node_range(c.nnodes)
    in_launcher = RDZV_BACKENDS[str(c.rdzv_backend)].store_in_launcher  # c10d
    if in_launcher:
        # torch's handler shares one TCPStore server across rounds and rebuilds its address only where its cache is
        # empty: a host that joins a later round as node >= 1 then waits for an address node 0 never writes again
        # (dynamic_rendezvous.py, next_rendezvous). Node 0's launcher hosts each round's store for the ranks itself
        # (nodes.agree); the handler is told not to share its own (its documented opt-out, read from the environment).
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    params = RendezvousParameters(
        backend=str(c.rdzv_backend), endpoint=c.rdzv_endpoint, run_id=c.rdzv_id, min_nodes=lo, max_nodes=hi,
        local_addr=c.local_addr or None, join_timeout=str(int(c.rdzv_timeout_s)),
        **(_is_host(str(c.rdzv_endpoint), str(c.local_addr or "")) if in_launcher else {}),
        **{**_read_timeout(c), **{k: str(v) for k, v in dict(c.rdzv_conf or {}).items()}},
    )
    try:
        with _native_stderr() as retries:
            bound = float(params.config.get("read_timeout", READ_TIMEOUT_S)) + 15  # its client's retries, and then some
            return _bounded(lambda: get_rendezvous_handler(params), bound)
    except (RendezvousError, RuntimeError, TimeoutError, OSError, ValueError) as e:
        start = ("Start the node that hosts it (the endpoint's host) first, with the same command." if in_launcher else
                 "Start etcd there with the v2 API (etcd --enable-v2) and check this host reaches it.")
        if in_launcher and _held_here(str(c.rdzv_endpoint)):
            start = ("Its port is held on this host by a program that does not answer as torch's store (another "
                     "job's?): free it, or give cluster.rdzv_endpoint another port.")
        cause = f" ({first_line(e.__cause__)})" if e.__cause__ is not None else ""
        tried = f" (after {retries[0]} retries of torch's store client)" if retries and retries[0] else ""
        raise RuntimeError(f"the rendezvous at cluster.rdzv_endpoint={c.rdzv_endpoint} cannot be reached: "
                           f"{type(e).__name__}: {first_line(e)}{cause}{tried}. {start}") from None


def _bounded(make, timeout_s: float):
    """``make()`` in a thread of its own, waited for at most ``timeout_s`` (TimeoutError then). torch's store client
    can wait without a bound inside C++ (a port held by a program that accepts the connection and never answers),
    where no signal reaches Python: this thread stays in Python, so SIGTERM and Ctrl-C still stop the launcher."""
    import threading

    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = make()
        except BaseException as e:  # noqa: BLE001 - handed to the caller as it was raised
            done["error"] = e

    thread = threading.Thread(target=run, name="hl-rendezvous-handler", daemon=True)
    thread.start()
    # (a signal's handler still runs during the wait: the join is interruptible; TIMEOUT_MAX: a bound from
    # cluster.rdzv_conf's read_timeout past what a lock can wait is no bound)
    thread.join(min(timeout_s, threading.TIMEOUT_MAX))
    if thread.is_alive():
        raise TimeoutError(f"no answer in {timeout_s:g} s")
    if "error" in done:
        raise done["error"]
    return done["value"]


def _held_here(endpoint: str) -> bool:
    """Whether the endpoint's address is this host's and its port is in use here (no bind)."""
    host, port = endpoint_host(endpoint), endpoint.rpartition(":")[2]
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, int(port)))
    except OSError as e:
        return e.errno == errno.EADDRINUSE  # (another errno: not this host's address)
    except ValueError:
        return False
    return False


@contextmanager
def _native_stderr() -> Iterator[list[int]]:
    """fd 2 set aside for the call (torch's store client logs each retry of its connect with a C++ stack): passed on
    when it returns; when it raises, dropped, the list given holding how many retries it logged."""
    sys.stderr.flush()
    saved, retries = os.dup(2), []
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield retries
        except BaseException:
            held.seek(0)
            retries.append(held.read().count(b"retrying (try="))
            raise
        else:
            held.seek(0)
            os.write(saved, held.read())
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _read_timeout(c: DictConfig) -> dict[str, str]:
    """torch's store client waits read_timeout (60 s) for the endpoint to answer, retrying, before the rendezvous'
    own join_timeout counts: a shorter cluster.rdzv_timeout_s bounds that wait too (unless rdzv_conf sets it)."""
    return {"read_timeout": str(max(1, int(c.rdzv_timeout_s)))} if c.rdzv_timeout_s < READ_TIMEOUT_S else {}
