"""The heartbeats between elastic launchers (launcher/launch/liveness.py) on a real TCPStore: a node that stops
beating is named silent after the timeout, and a store that stops answering is lost (its server gone), while the
supervising loop's calls (``silence``) never touch the network."""

import time
from datetime import timedelta

import torch.distributed as dist

from launcher.launch.liveness import Liveness, beat_interval


def _store(port: int = 0, master: bool = True, server=None):
    if master:
        return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))


def _until(cond, limit: float) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit, "timed out"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_a_node_that_stops_beating_is_silent_after_the_timeout_and_a_published_failure_is_read():
    server = _store()
    a = Liveness(server, 0, 2, timeout_s=1.5).start()
    b = Liveness(_store(master=False, server=server), 1, 2, timeout_s=1.5).start()
    try:
        time.sleep(1.0)
        assert a.silence() is None and b.silence() is None  # both beat
        b.stop()
        took = _until(lambda: a.silence() is not None, 5.0)
        s = a.silence()
        assert s.nodes == (1,) and not s.store and 1.5 <= s.silent_s < 3.0 and took <= 2.5
        server.set("hl/failed", '{"rank": 3}')
        _until(lambda: a.failure is not None, 2.0)
        assert a.failure == {"rank": 3}
    finally:
        a.stop()
        b.stop()


def test_a_store_that_stops_answering_is_lost_and_not_called_again():
    server = _store()
    client = _store(master=False, server=server)
    b = Liveness(client, 1, 2, timeout_s=1.0).start()
    a = Liveness(server, 0, 2, timeout_s=1.0).start()
    time.sleep(0.6)
    a.stop()
    del server, a  # the store's server goes with its last reference
    _until(lambda: b.silence() is not None, 6.0)
    s = b.silence()
    assert s.store and s.nodes == (0,) and b.store_lost
    b.stop()


def test_beats_six_times_within_the_timeout_between_a_fifth_of_a_second_and_five():
    assert beat_interval(30) == 5.0 and beat_interval(60) == 5.0 and beat_interval(6) == 1.0
    assert beat_interval(0.5) == 0.2
