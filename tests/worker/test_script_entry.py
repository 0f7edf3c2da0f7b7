"""launcher.worker.script: a script= rank runs the user's script as ``python script.py`` would and ends with the
script's own exit status, without the interpreter's teardown (gloo's abort at exit)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.worker.script import exit_code

SCRIPT = """\
import atexit, os, sys, threading, time
import helper_beside_the_script  # found because the script's folder is first on sys.path, as under python
print("name", __name__, "argv", sys.argv[1:], "file", __file__, flush=True)
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.3)
    print("thread done", flush=True)
threading.Thread(target=late).start()
if sys.argv[1] == "raise":
    raise ValueError("the script's own error")
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "helper_beside_the_script.py").write_text("")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {"TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json"), "PATH": "/usr/bin:/bin"}
    # cwd elsewhere: the script's folder, not the cwd, is where its own imports are found
    return subprocess.run([sys.executable, "-m", "launcher.worker.script", str(tmp_path / "train.py"), *args],
                          capture_output=True, text=True, cwd="/", env=env, timeout=120)


@pytest.mark.parametrize("arg, code", [("3", 3), ("a message", 1)])  # exit 0: every script= run
def test_the_scripts_exit_is_the_ranks_with_threads_joined_and_atexit_run(tmp_path, arg, code):
    res = _run(tmp_path, arg)
    assert res.returncode == code, res.stderr
    assert f"name __main__ argv ['{arg}'] file {tmp_path / 'train.py'}" in res.stdout
    assert res.stdout.index("thread done") < res.stdout.index("atexit ran"), res.stdout
    assert ("a message" in res.stderr) == (arg == "a message")
    assert not (tmp_path / "error.json").exists()


def test_an_exception_is_shown_from_the_scripts_frame_and_recorded_for_the_launcher(tmp_path):
    res = _run(tmp_path, "raise")
    assert res.returncode == 1
    assert "ValueError: the script's own error" in res.stderr and "runpy" not in res.stderr, res.stderr
    assert res.stderr.index("Traceback") < res.stderr.index(str(tmp_path / "train.py"))
    recorded = json.loads((tmp_path / "error.json").read_text())["message"]
    assert recorded["message"] == "ValueError: the script's own error"
    assert "runpy" not in recorded["extraInfo"]["py_callstack"]
    assert "thread done" in res.stdout and "atexit ran" in res.stdout


def test_exit_codes_follow_python():
    assert [exit_code(SystemExit(c)) for c in (None, 0, 5)] == [0, 0, 5]
