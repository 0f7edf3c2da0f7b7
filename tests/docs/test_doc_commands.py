"""Every launcher command the manual shows runs, and every output it quotes is what the command prints.

Each shell command in a fenced block of README.md and docs/*.md that invokes the launcher (``./run.sh ...``,
``hetero-launch ...``, ``python -m launcher ...``, continuation lines joined) is run by the launcher's main in this
process (as tests/conftest.py's ``cli`` fixture does), in a scratch folder holding the small files the page asks the
reader to make: as a dry run (``dry_run=true`` appended) unless it is one already or starts nothing anyway (``check``,
``--help``, ``--version``, ``--cfg job``, Hydra's completion). Commands that cannot run here are in SKIP, by page, each
with its reason; a SKIP entry that matches no command fails (so the list never outlives its commands).

The exit code is the one the page implies: 2 where the prose right before the block says the command exits 2, else 0.
A quoted output is a ``$ command`` line's following lines, or a plain block right after a block of commands (its last
command's output). Each quoted line must be in what the command printed (stdout and stderr), compared with the
whitespace and the tree's drawing characters collapsed (a wrap at another width changes neither); ``...`` elides any
text, a run id (``wide_deep-20261129-100014``) stands for any. The host is this CI machine's shape, whatever runs the
test: 2 cores, no accelerator, 25.28 GB (the figures the pages quote); ``COLUMNS=`` before a command sets the width,
else 120 (the width the pages' transcripts were printed at).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SKIP = {
    # page: {a piece of the command: why it cannot run here}
    "README.md": {
        "./run.sh test": "runs this test suite",
        "report log_output/latest": "reports a finished run; the scratch folder has none",
    },
    "running.md": {
        "./run.sh test": "runs this test suite",
        "report log_output/latest": "reports a finished run; the scratch folder has none",
        "trainer.resume=log_output/gpt-": "resumes a run of the reader's that the scratch folder does not have",
        "trainer.resume_from=log_output/gpt-": "resumes a run of the reader's that the scratch folder does not have",
        "trainer.resume=latest": "resumes the newest run; the scratch folder has none",
    },
    "ci.md": {"./run.sh test": "runs this test suite"},
    "multi_node.md": {
        "report log_output/latest node1-run": "merges two nodes' finished run dirs",
        "salloc ": "runs inside a Slurm allocation",
        "cluster.master_addr=node0.cluster": "names the cluster's first host, which this machine cannot resolve (a dry "
                                             "run checks the store's address as the run does)",
    },
    "parameter_server.md": {"cluster.nnodes=2 ...": "the page elides the rest of the command (...)"},
}

HERE = {"tabular_stream.md": {"/data/": "data/"}}
"""An absolute path a page names, and where the scratch folder has its files instead (page: {from: to})."""
WIDTH = "120"
"""COLUMNS for a command the page gives no width."""
HOST = {"cpu_count": 2, "accelerators": 0, "host_memory": 25_276_502_016, "device_memory": 0}
"""The machine the pages' figures come from (budgets and shares of the host's memory are printed)."""

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_SHELL = {"", "bash", "sh", "shell", "console", "yaml", "yml"}
_LAUNCHER = re.compile(r"(?:^|(?<=\s))(?:\.venv/bin/)?(?:\./run\.sh|hetero-launch|python -m launcher)(?=\s|$)")
_ENV = re.compile(r"^((?:\w+=\S*\s+)*)")
_EXIT_2 = re.compile(r"exit(?:s| code| with exit code)? 2\b")
_AS_IS = {"--help", "-h", "--version", "-V", "-sc", "--shell-completion", "--cfg", "-c", "--info", "-i",
          "--hydra-help", "dry_run=true"}
_RUN_ID = re.compile(r"\b[\w.]+-\d{8}-\d{6}(?:-\d+)?\b")
_TREE = re.compile(r"[│├└─┬┼]+")


@dataclasses.dataclass(frozen=True)
class DocCommand:
    page: str
    line: int
    text: str
    """The command as the page writes it, continuation lines joined, its comment and prompt dropped."""
    output: tuple[str, ...] = ()
    """The lines the page quotes as its output."""
    expect: int = 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _joined(lines: list[str]) -> list[tuple[int, int, str]]:
    """(index of the first line, of the last, the line with its ``\\`` continuations joined)."""
    out, i = [], 0
    while i < len(lines):
        first, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1].rstrip() + " " + lines[i].strip()
        out.append((first, i, line))
        i += 1
    return out


def _command(line: str) -> str | None:
    """The launcher command on a line (its ``eval "$(...)"`` or YAML ``- run:`` wrapping taken off), or None."""
    line = re.sub(r"^\s*-\s+(?:run:\s*)?", "", line).strip()
    if m := re.match(r'eval "\$\((.*)\)"', line):
        line = m.group(1)
    line = re.sub(r"\s+#\s.*$", "", line)  # the page's comment
    return line if _LAUNCHER.search(line) else None


def commands_of(page: str, text: str) -> list[DocCommand]:
    """The launcher commands in a page's fenced blocks, each with the output the page quotes for it."""
    found: list[DocCommand] = []
    fences = list(_FENCE.finditer(text))
    quoted: set[int] = set()  # blocks taken as the output of the block before them
    for n, fence in enumerate(fences):
        if fence.group(1) not in _SHELL or n in quoted:
            continue
        start = text[:fence.start()].count("\n") + 2  # the block's first line
        before = " ".join(text[fences[n - 1].end() if n else 0:fence.start()][-400:].split())
        expect = 2 if _EXIT_2.search(before) else 0  # the prose right before it says the command exits 2
        lines = fence.group(2).splitlines()
        if any(line.startswith("$ ") for line in lines):  # a transcript: $ command, then what it printed
            prompts = [(first, last, line) for first, last, line in _joined(lines) if line.startswith("$ ")]
            for k, (first, last, line) in enumerate(prompts):
                end = prompts[k + 1][0] if k + 1 < len(prompts) else len(lines)
                found.append(DocCommand(page, start + first, line[2:].strip(), tuple(lines[last + 1:end]), expect))
            continue
        block = [DocCommand(page, start + i, cmd) for i, _, line in _joined(lines) if (cmd := _command(line))]
        after = fences[n + 1] if n + 1 < len(fences) else None
        if block and after and not after.group(1) and not text[fence.end():after.start()].strip():
            block[-1] = dataclasses.replace(block[-1], output=tuple(after.group(2).splitlines()), expect=expect)
            quoted.add(n + 1)
        found += block
    return found


def doc_commands() -> list[DocCommand]:
    return [c for page in PAGES for c in commands_of(page.name, page.read_text())]


COMMANDS = doc_commands()


def _skip_reason(cmd: DocCommand) -> str | None:
    return next((why for piece, why in SKIP.get(cmd.page, {}).items() if piece in cmd.text), None)


def test_the_pages_show_commands_and_every_skip_matches_one():
    assert len(COMMANDS) > 50 and len({c.page for c in COMMANDS}) > 10, [c.id for c in COMMANDS]
    stale = [f"{page}: {piece}" for page, pieces in SKIP.items() for piece in pieces
             if not any(c.page == page and piece in c.text for c in COMMANDS)]
    assert not stale, f"SKIP entries that match no command any more: {stale}"


def _words(command: str, cwd: Path) -> tuple[dict[str, str], list[str]]:
    """(the VAR=value prefix, the launcher's arguments) as bash splits the command (quotes, $(...))."""
    env_part = _ENV.match(command).group(1)
    env = dict(w.split("=", 1) for w in env_part.split())
    rest = command[len(env_part):]
    out = subprocess.run(["bash", "-c", f'printf "%s\\0" {rest}'], cwd=cwd, capture_output=True, text=True,
                         check=True).stdout
    words = out.split("\0")[:-1]
    launcher = _LAUNCHER.search(rest).group(0).split()
    assert words[:len(launcher)] == launcher, (command, words)
    return env, words[len(launcher):]


def _as_run(words: list[str]) -> list[str]:
    if words[:1] in (["check"], ["report"]) or _AS_IS & set(words):
        return words
    return [*words, "dry_run=true"]


# What each page asks the reader to have, made small in the scratch folder ----------------------------------------

def _write_ctr_project(folder: Path) -> Path:
    from tests.usercode.readme_project import write_project

    return write_project(folder)


def _write_dlrm_project(folder: Path) -> Path:
    from tests.conftest import needs_torchrec

    needs_torchrec()
    text = (ROOT / "docs" / "torchrec.md").read_text()
    files = dict(re.findall(r"^`([\w./]+\.(?:py|yaml))`:\n```\w+\n(.*?)^```", text, re.MULTILINE | re.DOTALL))
    for name, body in {**files, "clicks/__init__.py": ""}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(body)
    return folder


def _write_inputs(folder: Path) -> Path:
    """clicks.csv (your_data.md), ds_config.json (parallelism.md), hostfile and an HCCL rank table of 2 servers × 8
    devices (multi_node.md), path/to/train.py (your_script.md), Criteo-shaped Parquet under data/ (tabular_stream.md's
    /data/criteo, read from there)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from criteo_parquet import write_criteo_parquet
    from tests.data.make_ctr_csv import write_ctr_csv

    write_ctr_csv(str(folder / "clicks.csv"), 2000)
    (folder / "ds_config.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "overlap_comm": True, "contiguous_gradients": True}}))
    (folder / "hostfile").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    (folder / "hccl_2s_16p.json").write_text(json.dumps({
        "version": "1.0", "server_count": "2", "status": "completed",
        "server_list": [{"server_id": f"10.0.0.{s + 1}", "device": [
            {"device_id": str(d), "device_ip": f"192.168.{s}.{d}", "rank_id": str(8 * s + d)} for d in range(8)]}
            for s in range(2)]}))
    (folder / "path" / "to").mkdir(parents=True)
    (folder / "path" / "to" / "train.py").write_text("import torch.distributed as dist\ndist.init_process_group()\n")
    write_criteo_parquet(folder / "data" / "criteo", 2000, group=500, groups_per_file=2)
    write_criteo_parquet(folder / "data" / "criteo-eval", 500, group=500, seed=1)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Where each command runs: my_project/ for my_ctr (your_model.md), my_recsys/ for dlrm (torchrec.md), else a
    folder with every other page's files; made once, each when first asked for. Afterwards the folders leave
    sys.path and their modules sys.modules (a later test file in this process may bring its own my_ctr)."""
    made: dict[str, Path] = {}
    path = list(sys.path)

    def folder(command: str) -> Path:
        kind = ("my_project" if "my_ctr" in command or "train_ctr.py" in command else
                "my_recsys" if "recipe=dlrm" in command else "inputs")
        if kind not in made:
            make = {"my_project": _write_ctr_project, "my_recsys": _write_dlrm_project, "inputs": _write_inputs}[kind]
            made[kind] = make(tmp_path_factory.mktemp(kind))
        return made[kind]

    yield folder
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if any(str(f) in str(getattr(module, "__file__", None) or "") for f in made.values()):
            del sys.modules[name]


def _normal(text: str) -> str:
    return " ".join(_TREE.sub(" ", text).split())


def missing_lines(quoted: tuple[str, ...], printed: str) -> list[str]:
    """The quoted lines not in what was printed (see the module's docstring for how they are compared)."""
    printed = _normal(printed)
    missing = []
    for line in quoted:
        pieces = [_normal(p) for p in line.split("...")]
        if not any(pieces):
            continue
        pattern = r".*?".join(r"[\w.]+-\d{8}-\d{6}(?:-\d+)?".join(re.escape(x) for x in _RUN_ID.split(p))
                              for p in pieces if p)
        if not re.search(pattern, printed):
            missing.append(line)
    return missing


def test_commands_of_a_page():
    page = (
        "Bad input exits 2:\n\n```\n$ ./run.sh recipe=x \\\n    a=1\nhetero-launch: 1 problem\n  - a=1 is bad\n"
        "$ hetero-launch --version\nhetero-launch 1.0\n```\n\n```bash\n./run.sh recipe=y   # a comment\n"
        "torchrun train.py\neval \"$(.venv/bin/hetero-launch -sc install=bash)\"\n"
        ".venv/bin/python -m launcher check \\\n  -m recipe=z\n```\n```\nplan: recipe z\n```\n\n"
        "```yaml\nsteps:\n  - run: ./run.sh check\n```\n```python\nprint('hetero-launch')\n```\n")
    assert [(c.line, c.text, c.output, c.expect) for c in commands_of("p.md", page)] == [
        (4, "./run.sh recipe=x a=1", ("hetero-launch: 1 problem", "  - a=1 is bad"), 2),
        (8, "hetero-launch --version", ("hetero-launch 1.0",), 2),
        (13, "./run.sh recipe=y", (), 0),
        (15, ".venv/bin/hetero-launch -sc install=bash", (), 0),
        (16, ".venv/bin/python -m launcher check -m recipe=z", ("plan: recipe z",), 0),
        (25, "./run.sh check", (), 0)]


def test_missing_lines_collapses_wraps_and_reads_elisions():
    printed = "├── a b\n│   c d …\n└── plan written to log_output/gpt-20261129-100014-1\n"
    quoted = ("├── a b c", "d …", "plan written to log_output/x-20260101-000000", "a ... d")
    assert missing_lines(quoted, printed) == []
    assert missing_lines(("a c",), printed) == ["a c"]


_RAN: dict[tuple, tuple[int, str]] = {}
"""(folder, environment, arguments) -> (exit code, what it printed)."""


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_the_command_runs_as_the_page_says(cmd, folders, monkeypatch, capsys):
    if reason := _skip_reason(cmd):
        pytest.skip(reason)
    from launcher.cli import main
    from launcher.facts import host

    probe = host.probe_host
    monkeypatch.setattr(host, "probe_host", lambda: dataclasses.replace(probe(), **HOST))
    cwd = folders(cmd.text)
    text = cmd.text
    for there, here in HERE.get(cmd.page, {}).items():
        text = text.replace(there, here)
    env, words = _words(text, cwd)
    monkeypatch.chdir(cwd)
    env.setdefault("COLUMNS", WIDTH)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    key = (str(cwd), tuple(sorted(env.items())), tuple(words))
    if key not in _RAN:  # the same command on another page (README's and running.md's, the CI files') runs once
        capsys.readouterr()
        try:
            code = main(_as_run(words))
        except SystemExit as e:  # Hydra's own flags end with sys.exit
            code = e.code or 0
        out, err = capsys.readouterr()
        _RAN[key] = code, out + err
    code, printed = _RAN[key]
    assert code == cmd.expect, f"{cmd.id}: {cmd.text}\nexit {code}, the page implies {cmd.expect}:\n{printed[-3000:]}"
    missing = missing_lines(cmd.output, printed)
    assert not missing, f"{cmd.id}: {cmd.text}\nquoted but not printed: {missing}\nprinted:\n{printed}"
