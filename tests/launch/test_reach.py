"""What an elastic job's hosts check before they meet (launcher/launch/reach.py, launcher/launch/nodes.py): the
etcd-v2 rendezvous' server is there and speaks the v2 API, refused in seconds naming the fix; and the round's first
failure is written once on either store (a TCPStore compares and sets; torch's EtcdStore cannot, and an ``add``
decides there). The etcd cases run a real etcd server (Debian's etcd-server) on loopback, else skip saying why."""

import importlib.util
import socket
import subprocess
import threading
import time
import urllib.request
from datetime import timedelta

import pytest
from omegaconf import OmegaConf

from launcher.launch.nodes import first_write
from launcher.launch.reach import rendezvous_problems
from tests.hosts import etcd_missing

ETCD = etcd_missing()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cfg(backend: str, endpoint: str):
    return OmegaConf.create({"cluster": {"rdzv_backend": backend, "rdzv_endpoint": endpoint}})


@pytest.fixture
def etcd_server(tmp_path):
    """start(v2) -> the client port of a one-member etcd on loopback (its v2 API on or off)."""
    if ETCD:
        pytest.skip(ETCD)
    procs = []

    def start(v2: bool) -> int:
        client, peer = _free_port(), _free_port()
        procs.append(subprocess.Popen(
            ["etcd", "--name", "t", "--data-dir", str(tmp_path / f"etcd{client}"), f"--enable-v2={str(v2).lower()}",
             "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls",
             f"http://127.0.0.1:{client}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster",
             f"t=http://127.0.0.1:{peer}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    f"http://127.0.0.1:{client}/version", timeout=1)
                return client
            except OSError:
                assert time.monotonic() < deadline, "etcd did not start"
                time.sleep(0.2)

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_c10d_needs_nothing_checked_here():
    assert rendezvous_problems(_cfg("c10d", "127.0.0.1:1")) == []


@pytest.mark.skipif(importlib.util.find_spec("etcd") is None, reason="no python-etcd (pip install python-etcd)")
def test_an_etcd_endpoint_nothing_answers_is_refused_in_seconds():
    port = _free_port()
    started = time.monotonic()
    (problem,) = rendezvous_problems(_cfg("etcd-v2", f"127.0.0.1:{port}"))
    assert time.monotonic() - started < 10
    assert problem.startswith(f"cluster.rdzv_backend=etcd-v2 (cluster.rdzv_endpoint=127.0.0.1:{port}): no etcd "
                              f"server answered at http://127.0.0.1:{port}/v2/keys within 5 s"), problem
    assert "Start an etcd member there (etcd --enable-v2=true" in problem


def test_an_etcd_without_its_v2_api_is_refused_and_with_it_passes(etcd_server):
    off = etcd_server(v2=False)
    (problem,) = rendezvous_problems(_cfg("etcd-v2", f"127.0.0.1:{off}"))
    assert "does not serve the v2 API" in problem and "Start etcd with --enable-v2=true" in problem
    on = etcd_server(v2=True)
    assert rendezvous_problems(_cfg("etcd-v2", f"127.0.0.1:{on}")) == []


def _first_writes(store) -> list:
    return [first_write(store, "hl/failed", value) for value in ('{"node": 1}', '{"node": 2}')]


def test_the_first_failure_is_written_once_on_a_tcp_store():
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    assert [bytes(v) if not isinstance(v, str) else v.encode() for v in _first_writes(store)] == [b'{"node": 1}'] * 2


def test_the_first_failure_is_written_once_on_etcd(etcd_server):
    import etcd
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

    port = etcd_server(v2=True)
    base = EtcdStore(etcd.Client(host="127.0.0.1", port=port), "/torch/elastic/store", timedelta(seconds=5))
    store = PrefixStore("round.1", base)  # as torch's rendezvous hands it over (base kept: a Python store)
    first, second = _first_writes(store)
    assert first == '{"node": 1}' and second == b'{"node": 1}'  # the second writer reads the first's
    assert store.get("hl/failed") == b'{"node": 1}'


def test_a_first_writer_lost_before_it_wrote_is_waited_for_a_bounded_time(etcd_server, monkeypatch):
    import etcd
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

    import launcher.launch.nodes as nodes

    monkeypatch.setattr(nodes, "FIRST_WRITE_WAIT_S", 1.0)
    base = EtcdStore(etcd.Client(host="127.0.0.1", port=etcd_server(v2=True)), "/torch/elastic/store",
                     timedelta(seconds=30))
    store = PrefixStore("round.2", base)
    store.add("hl/failed/claim", 1)  # a node claimed the first failure, then was lost before writing it
    started = time.monotonic()
    with pytest.raises(LookupError):
        first_write(store, "hl/failed", '{"node": 2}')
    assert time.monotonic() - started < 10


def test_an_endpoint_that_answers_no_store_is_left_within_rdzv_timeout_s_without_cpp_stacks(capfd):
    """Something listens at the endpoint but is no TCPStore (a proxy, another service): torch's store client retried
    its ping for read_timeout (60 s), whatever cluster.rdzv_timeout_s said, each retry logged with a C++ stack."""
    from launcher.launch.rendezvous import rendezvous_handler

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def answer_nonsense() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(64)
                conn.sendall(b"\0" * 8)

    thread = threading.Thread(target=answer_nonsense, daemon=True)
    thread.start()
    cluster = {"nnodes": 2, "rdzv_backend": "c10d", "rdzv_endpoint": f"127.0.0.1:{listener.getsockname()[1]}",
               "rdzv_id": "probe", "local_addr": "192.0.2.2", "rdzv_timeout_s": 5, "rdzv_conf": {}}
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"cannot be reached: .* \(after \d+ retries of torch's store client\)"):
            rendezvous_handler(OmegaConf.create({"cluster": cluster}))
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert time.monotonic() - start < 5 + 10  # the bound given, and a retry's delay
    assert "frame #" not in capfd.readouterr().err


def test_an_endpoint_that_accepts_and_never_answers_is_left_in_bounded_time_and_signals_reach_the_launcher():
    """A port on this host held by a program that accepts the connection and never reads or answers: torch's store
    client waited inside C++ with no bound (SIGTERM and Ctrl-C unheard until that program ended). Now the wait is
    bounded (the client's read_timeout and 15 s), the message says the port is held here, and a signal raised in the
    launcher's thread meanwhile stops it at once."""
    from launcher.launch.rendezvous import _bounded, rendezvous_handler

    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    cluster = {"nnodes": 1, "rdzv_backend": "c10d", "rdzv_endpoint": f"127.0.0.1:{listener.getsockname()[1]}",
               "rdzv_id": "held", "local_addr": None, "rdzv_timeout_s": 1, "rdzv_conf": {}}
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"cannot be reached: .*Its port is held on this host by a program that "
                                               r"does not answer as torch's store"):
            rendezvous_handler(OmegaConf.create({"cluster": cluster}))
    finally:
        listener.close()
    assert time.monotonic() - start < 1 + 15 + 5
    with pytest.raises(TimeoutError, match="no answer in 0.3 s"):
        _bounded(lambda: time.sleep(30), 0.3)
    assert _bounded(lambda: 7, 1) == 7
    with pytest.raises(KeyError):  # what make() raises, as it raised it
        _bounded(lambda: {}["x"], 1)
