"""The rank blamed for a failure is decided by evidence: who ended first on its own, and who only lost a peer."""

from launcher.launch.blame import Ending, first_failure

GLOO_PEER_LOST = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:7378. This is typically caused by a remote worker crashing.")


def test_a_killed_rank_is_blamed_over_the_peer_that_lost_it_even_when_the_peer_is_seen_first():
    killed = Ending(rank=1, exit_code=-9, seen_s=10.05, error_s=None, error="")
    peer = Ending(rank=0, exit_code=1, seen_s=10.00, error_s=9.99, error=GLOO_PEER_LOST)
    assert first_failure([peer, killed]).rank == 1
    assert first_failure([killed, peer]).rank == 1


def test_of_two_own_failures_the_earlier_error_is_blamed():
    late = Ending(rank=0, exit_code=1, seen_s=10.0, error_s=9.5, error="ValueError: bad batch")
    early = Ending(rank=1, exit_code=1, seen_s=10.0, error_s=9.2, error="RuntimeError: CUDA error")
    assert first_failure([late, early]).rank == 1


def test_a_signal_death_is_timed_by_when_it_was_seen():
    crash = Ending(rank=2, exit_code=-11, seen_s=5.0, error_s=None, error="")
    later = Ending(rank=0, exit_code=1, seen_s=6.0, error_s=5.5, error="ValueError: x")
    assert first_failure([later, crash]).rank == 2


def test_when_every_failure_is_a_lost_peer_the_first_is_blamed_and_clean_exits_never():
    a = Ending(rank=0, exit_code=1, seen_s=3.0, error_s=2.0, error=GLOO_PEER_LOST)
    b = Ending(rank=1, exit_code=1, seen_s=3.0, error_s=1.0, error="Connection reset by peer")
    done = Ending(rank=2, exit_code=0, seen_s=0.5, error_s=None, error="")
    assert first_failure([a, b, done]).rank == 1
    assert first_failure([done]) is None
