"""The rank blamed for a failure is decided by evidence: who ended first on its own, and who only lost a peer."""

from launcher.launch.blame import Ending, blame_reason, first_failure

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


def test_when_every_failure_is_a_lost_peer_the_first_is_blamed():
    a = Ending(rank=0, exit_code=1, seen_s=3.0, error_s=2.0, error=GLOO_PEER_LOST)
    b = Ending(rank=1, exit_code=1, seen_s=3.0, error_s=1.0, error="Connection reset by peer")
    assert first_failure([a, b]).rank == 1
    assert "every failure was the loss of a peer" in blame_reason(b, [a, b])


def test_no_failure_blames_no_one_however_early_a_rank_exited():
    done = Ending(rank=2, exit_code=0, seen_s=0.5, error_s=None, error="", last_step=3, planned_steps=10)
    assert first_failure([done]) is None


def test_a_rank_that_exits_0_while_its_peer_then_loses_it_is_named_first():
    """A script's rank 1 returns after the first all-reduce; rank 0, in the next one, gets gloo's lost peer. Seen in
    the same poll, rank 1 is named, not rank 0 (whose error is only the loss of its peer)."""
    left = Ending(rank=1, exit_code=0, seen_s=4.0, error_s=None, error="", last_step=None)
    peer = Ending(rank=0, exit_code=1, seen_s=4.0, error_s=3.9, error=GLOO_PEER_LOST)
    assert first_failure([peer, left]).rank == 1
    reason = blame_reason(left, [peer, left])
    assert reason == ("it exited 0 while other ranks still ran, and no rank failed of its own; rank 0 then failed "
                      "having lost a peer"), reason


def test_a_recipe_rank_that_exits_0_before_the_last_step_comes_before_a_later_own_failure():
    left = Ending(rank=2, exit_code=0, seen_s=1.0, error_s=None, error="", last_step=3, planned_steps=10)
    later = Ending(rank=0, exit_code=1, seen_s=2.0, error_s=1.5, error="ValueError: bad batch")
    assert left.left_early and first_failure([later, left]).rank == 2
    assert blame_reason(left, [later, left]).startswith("it exited 0 at step 3, before the plan's last step (10); "
                                                        "the first of rank 0, 2 by when the launcher saw each end")


def test_a_rank_that_did_all_its_steps_is_not_blamed_over_one_that_failed_of_its_own():
    done = Ending(rank=1, exit_code=0, seen_s=1.0, error_s=None, error="", last_step=10, planned_steps=10)
    crash = Ending(rank=0, exit_code=1, seen_s=2.0, error_s=1.5, error="ValueError: bad batch")
    peer = Ending(rank=2, exit_code=1, seen_s=2.0, error_s=1.6, error=GLOO_PEER_LOST)
    assert not done.left_early and first_failure([done, peer, crash]).rank == 0


def test_a_clean_exit_is_never_a_lost_peer_whatever_its_stderr_says():
    left = Ending(rank=1, exit_code=0, seen_s=1.0, error_s=None, error=GLOO_PEER_LOST)
    assert not left.lost_peer


def test_times_on_different_clocks_are_never_compared():
    """Error files are timed by the file system's clock (a file server's, maybe minutes off); a signal leaves none.
    Then both are ordered by when the launcher saw them end, not by mixing the two clocks."""
    own = Ending(rank=0, exit_code=1, seen_s=10.2, error_s=1e9 - 600, error="ValueError: x")  # the server's clock
    killed = Ending(rank=1, exit_code=-9, seen_s=10.0, error_s=None, error="")
    assert first_failure([own, killed]).rank == 1
    assert "by when the launcher saw each end" in blame_reason(killed, [own, killed])


def test_exit_records_written_on_the_launchers_host_order_ranks_the_launcher_saw_together():
    a = Ending(rank=0, exit_code=-11, seen_s=5.0, error_s=None, error="", exit_s=1_700_000_000.30)
    b = Ending(rank=1, exit_code=-9, seen_s=5.0, error_s=None, error="", exit_s=1_700_000_000.10)
    assert first_failure([a, b]).rank == 1
    assert "by when each ended by its exit record" in blame_reason(b, [a, b])
    other_host = Ending(rank=1, exit_code=-9, seen_s=5.0, error_s=None, error="", exit_s=None)  # not comparable
    assert first_failure([a, other_host]).rank == 0  # seen together: the lowest rank


def test_the_evidence_read_from_the_run_dir_keeps_each_time_on_its_own_clock(tmp_path):
    """An exit record (rank_start's time.time()) counts only when written on the launcher's host (rank.N/pid names
    the host); the stderr is read from its end only; a clean exit's words are no evidence of a lost peer."""
    import json
    import socket
    from types import SimpleNamespace

    from launcher.launch.attempt import _endings
    from launcher.launch.supervise import Outcome, RankExit
    from launcher.rundir import RunDir

    run = RunDir(tmp_path / "run")
    for rank, host in ((0, socket.gethostname()), (1, "another-host"), (2, socket.gethostname())):
        d = run.rank(rank)
        d.path.mkdir(parents=True)
        d.pid.write_text(f"{host} {100 + rank}\n")
        d.write_exit(1 if rank < 2 else 0, 1_700_000_000.0 + rank)
        d.heartbeat.write_text(json.dumps({"step": 3}))
    run.rank(0).stderr.write_text("x" * 10_000_000 + "\n" + GLOO_PEER_LOST + "\n")
    run.rank(1).stderr.write_text("Connection reset by peer\n")
    run.rank(2).stderr.write_text(GLOO_PEER_LOST + "\n")
    outcome = Outcome(exits=tuple(RankExit(rank=r, exit_code=1 if r < 2 else 0, stopped_by_launcher=False, seen_s=5.0)
                                  for r in range(3)), interrupted=False)
    e0, e1, e2 = _endings(run, outcome, SimpleNamespace(kind="recipe", steps=10))
    assert (e0.exit_s, e1.exit_s, e2.exit_s) == (1_700_000_000.0, None, 1_700_000_002.0)
    assert e0.lost_peer and len(e0.error) < 10_000 and not e2.lost_peer
    assert e2.left_early and e2.last_step == 3 and e2.planned_steps == 10
    assert first_failure([e0, e1, e2]).rank == 2  # it left at step 3 of 10
