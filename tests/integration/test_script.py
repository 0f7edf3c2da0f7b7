"""A script written for torchrun runs unchanged under hetero-launch, with the same logs and failure handling."""

import ast
import json
import zipfile
from pathlib import Path

import pytest

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parents[1] / "data" / "allreduce_script.py"
LOG_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "log_script.py"
LEAVE_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "leave_early_script.py"


def test_torchrun_script_runs_unchanged(tmp_path):
    res = run_cli([f"script={SCRIPT}", "cluster.nproc_per_node=2", "output.console=all", "--", "--lr", "0.1", "it's"],
                  tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run = (tmp_path / "log_output" / "latest").resolve()
    assert run.name.startswith("script-")
    for rank in (0, 1):
        line = f"rank {rank}/2 sum=3.0 expected=3.0 args=['--lr', '0.1', \"it's\"]"
        assert line in (run / f"rank.{rank}" / "stdout").read_text()
        assert res.stdout.count(f"[rank {rank}] {line}") == 1, res.stdout  # output.console=all: each rank, prefixed
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and [r["exit_code"] for r in s["ranks"]] == [0, 0]
    assert s["note"] == "the script did not call runtime.log: no step or loss was recorded" and s["engine"] is None
    assert s["final_loss"] is None and "note: the script did not call runtime.log" in res.stdout
    assert "0/0" not in res.stdout
    env = json.loads((run / "rank_env.json").read_text())["1"]
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE"):
        assert key in env


def test_failing_script_rank_is_named(tmp_path):
    res = run_cli([f"script={SCRIPT}", "--", "--fail-on-rank", "1"], tmp_path)
    assert res.returncode == 1
    assert "rank 1 failed with exit code 3" in res.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "failed" and {r["rank"]: r["exit_code"] for r in s["ranks"]}[1] == 3


def test_missing_script_is_refused_before_anything_starts(tmp_path, cli):
    res = cli(["script=nope/train.py"], tmp_path)
    assert res.returncode == 2 and "script=nope/train.py: no such file" in res.stderr
    assert not (tmp_path / "log_output").exists()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("print(1)\n")  # `python app` runs it; the ranks run one file
    res = cli(["script=app"], tmp_path)
    assert res.returncode == 2 and ("script=app is a folder, not a Python script. Give the script in it: "
                                    "script=app/__main__.py.") in res.stderr, res.stderr


@pytest.mark.parametrize("source, words", [
    (b"import os\ndef main(:\n    pass\n", "SyntaxError at line 2, column 10: 'def main(:'"),
    (b"if True:\n    x = 1\n      y = 2\n", "IndentationError at line 3"),
    (b"print(1)\x00\n", "not a Python source"),
])
def test_a_script_python_cannot_compile_is_refused_before_any_rank_starts(tmp_path, cli, source, words):
    (tmp_path / "train.py").write_bytes(source)
    res = cli(["script=train.py"], tmp_path)
    assert res.returncode == 2 and "script=train.py: " in res.stderr and words in res.stderr, res.stderr
    assert not (tmp_path / "log_output").exists()


def test_a_latin_1_script_with_its_coding_line_and_a_zip_application_are_taken(tmp_path, cli):
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9t\xe9'\n")
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as z:
        z.writestr("__main__.py", "print('from a zip')\n")
    for script in ("latin.py", "app.pyz"):
        res = cli([f"script={script}", "dry_run=true"], tmp_path)
        assert res.returncode == 0, res.stderr


def test_script_output_streams_and_runtime_log_feeds_the_summary(tmp_path):
    res = run_cli([f"script={LOG_SCRIPT}", "cluster.nproc_per_node=2"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "if the script calls runtime.prepare(), it builds: ddp" in " ".join(res.stdout.split())
    # output.console=rank0 (the default): rank 0's stdout and stderr lines once, unprefixed; rank 1's in its files only
    assert res.stdout.count("hello from rank 0") == 1 and res.stdout.count("warning on rank 0") == 1, res.stdout
    assert "hello from rank 1" not in res.stdout and "warning on rank 1" not in res.stdout
    run = (tmp_path / "log_output" / "latest").resolve()
    assert (run / "rank.1" / "stdout").read_text() == "hello from rank 1\n"
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and "note" not in s
    assert s["completed_steps"] == 2 and [r["last_step"] for r in s["ranks"]] == [2, 2]
    assert s["final_loss"] == 1.0 and s["first_loss"] == 1.5 and s["final_metrics"] == {"acc": 0.5}
    assert "metrics: acc=0.5" in res.stdout and "1.00000" in res.stdout and "2/0" not in res.stdout


def test_unknown_output_console_is_refused(tmp_path, cli):
    res = cli([f"script={LOG_SCRIPT}", "output.console=rank1"], tmp_path)
    assert res.returncode == 2 and "output.console=rank1 is not one of rank0, all, none. Did you mean " \
        "output.console=rank0?" in res.stderr, res.stderr
    assert not (tmp_path / "log_output").exists()


def test_a_rank_that_exits_0_while_its_peer_goes_on_is_named_first(tmp_path):
    """Rank 1 leaves after the first all-reduce with exit code 0; rank 0 then loses it in the next one. The rank to
    name is the one that left, not the one gloo told 'Connection closed by peer'."""
    res = run_cli([f"script={LEAVE_SCRIPT}", "cluster.nproc_per_node=2"], tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    s = read_summary(tmp_path)
    ranks = {r["rank"]: r for r in s["ranks"]}
    assert s["first_failed_rank"] == 1 and ranks[1]["exit_code"] == 0 and ranks[0]["exit_code"] == 1
    assert ranks[1]["blame"].startswith("it exited 0 while other ranks still ran, and no rank failed of its own; "
                                        "rank 0 then failed having lost a peer"), ranks[1]
    out = " ".join(res.stdout.split())
    assert "rank 1 left first: it exited 0 while other ranks still ran." in out
    assert "failed after rank 1, having lost it as a peer: rank 0 (exit code 1)" in out


def test_script_arguments_after_the_double_dash_reach_the_script_byte_for_byte(tmp_path):
    args = ["--name=${x}", "${oc.env:HOME}", "\\${x}", "${x}\\", "--q=a'b", '--dq="x"', "--lit=\\\\n", "a b", "",
            "--", "k=v", "a,b", "[1, 2]", "null", "\\", "'", "ünï€ 🏖", "tab\there", "new\nline"]
    res = run_cli([f"script={SCRIPT}", "cluster.nproc_per_node=1", "--", *args], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    out = ((tmp_path / "log_output" / "latest").resolve() / "rank.0" / "stdout").read_text()
    assert ast.literal_eval(out.split(" args=", 1)[1]) == args  # the script's sys.argv[1:]


def test_ranks_that_never_meet_are_said_on_the_console_while_they_wait(tmp_path):
    """A script written for another world size waits in init_process_group for peers that never come: no rank
    writes or computes, and the launcher, which does not stop a script for waiting, says so once the quiet spell
    reaches launcher.watchdog_s (it was silent until torch's timeout: 30 min by default). Here the script's own
    timeout ends the wait, and the run fails as torch makes it fail."""
    script = tmp_path / "four.py"
    script.write_text("import datetime, os\nimport torch.distributed as dist\n"
                      "dist.init_process_group('gloo', rank=int(os.environ['RANK']), world_size=4,\n"
                      "                        timeout=datetime.timedelta(seconds=15))\n")
    res = run_cli([f"script={script}", "cluster.nproc_per_node=2", "launcher.watchdog_s=3"], tmp_path)
    out = " ".join(res.stdout.split())
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert out.count("no rank of this script has written a line or used the CPU for 3 s (launcher.watchdog_s): "
                     "ranks 0, 1 wait.") >= 1, out[-3000:]
    assert "the job has 2 ranks here, and the script must take its rank and world size from the environment" in out
