"""output.console's tee: the rank files' lines on a console, bounded, whatever the ranks write."""

import io

from rich.console import Console

from launcher.launch.tee import DRAIN_LINES, LINE_BYTES, READ_BYTES, TICK_LINES, RankTee, streamed_ranks
from launcher.rundir import RunDir


def _tee(tmp_path, ranks=(0,), prefixed=False):
    run_dir = RunDir(tmp_path)
    for r in ranks:
        run_dir.rank(r).path.mkdir()
    out = io.StringIO()
    return run_dir, RankTee(Console(file=out, width=80), run_dir, ranks, prefixed), out


def test_a_huge_line_is_cut_with_a_marker_and_the_lines_after_it_are_shown(tmp_path):
    run_dir, tee, out = _tee(tmp_path)
    with open(run_dir.rank(0).stdout, "wb") as f:
        f.write(b"first\n" + b"y" * 10_000_000)  # 10 MB, no newline yet: cut at once, not held
        f.flush()
        tee.tick()
        assert f"line cut at {LINE_BYTES} bytes: all of it is in rank.0/stdout" in out.getvalue()
        for _ in range(10_000_000 // READ_BYTES):  # the rest of that line is read, not shown
            tee.tick()
        f.write(b"y" * 1000 + b"\nafter\n")
    run_dir.rank(0).stderr.write_bytes(b"\x1b[31mred\x1b[0m\r\nbar 1\rbar 2\rbar 3\nno newline")
    tee.drain()
    lines = out.getvalue().splitlines()
    assert len(lines[1]) < LINE_BYTES + 100 and lines[1].startswith("y" * LINE_BYTES + " ... [line cut")
    assert [line for line in lines if not line.startswith("y")] == ["first", "after", "red", "bar 3", "no newline"]


def test_what_is_left_after_the_drain_limit_is_named_not_printed(tmp_path):
    run_dir, tee, out = _tee(tmp_path)
    run_dir.rank(0).stdout.write_bytes(b"x\n" * (TICK_LINES + DRAIN_LINES + 10))
    tee.tick()
    assert out.getvalue().splitlines() == ["x"] * TICK_LINES  # a tick prints at most TICK_LINES of a file
    tee.drain()
    lines = out.getvalue().splitlines()
    assert lines[:-1] == ["x"] * (TICK_LINES + DRAIN_LINES)
    assert lines[-1] == f"... 20 more bytes of rank.0/stdout not shown: all of it is in {run_dir.rank(0).stdout}"


def test_only_a_script_runs_ranks_are_streamed_and_prefixed_with_all(tmp_path):
    assert streamed_ranks("script", "rank0", (0, 1)) == (0,) and streamed_ranks("script", "all", (0, 1)) == (0, 1)
    assert streamed_ranks("script", "none", (0, 1)) == () and streamed_ranks("recipe", "all", (0, 1)) == ()
    run_dir, tee, out = _tee(tmp_path, (0, 1), prefixed=True)
    for r in (0, 1):
        run_dir.rank(r).stdout.write_text(f"hello {r}\n")
    tee.tick()
    tee.drain()
    assert out.getvalue().splitlines() == ["[rank 0] hello 0", "[rank 1] hello 1"]
