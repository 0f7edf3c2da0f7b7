"""A launch backend is one module and one registry line (issue 34): a toy backend, written here into a folder of its
own, starts each rank as a plain ``subprocess.Popen`` of its command with its variables from the plan, and a real
2-rank quickstart job runs on it through the normal CLI path (``launcher.cli.main``), no file of launcher/ changed.
And no code outside launcher/backends/ compares a backend's name as a string: the knowledge of what a backend can
do has one owner, the rest asks it (as tests/parallel/test_registry.py checks for the parallel parts)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.backends import BACKENDS
from tests.name_check import name_comparisons

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"

TOY_BACKEND = '''
"""cluster.launch=toy: each rank a plain subprocess.Popen of its command, with its variables from the plan."""

import subprocess
import sys

from launcher.backends import Backend, register
from launcher.backends.processes import stop_process_groups


class PopenJob:
    """The ranks as Popen objects (a launcher.backends.job.RankJob)."""

    def __init__(self, procs):
        self._procs = procs
        self.ranks = tuple(sorted(procs))

    def poll(self):
        return {r: code for r, p in self._procs.items() if (code := p.poll()) is not None}

    def pids(self):
        return {r: p.pid for r, p in self._procs.items()}

    def stop(self):
        stop_process_groups(list(self._procs.values()))
        for p in self._procs.values():
            p.wait()


class ToyBackend(Backend):
    name = "toy"
    help = "toy (plain Popen, a test's own)"

    def start(self, config, plan, run_dir, envs):
        procs = {}
        for rank, env in sorted(envs.items()):
            rank_dir = run_dir.rank(rank)
            rank_dir.path.mkdir(parents=True, exist_ok=True)
            with open(rank_dir.stdout, "wb") as out, open(rank_dir.stderr, "wb") as err:
                procs[rank] = subprocess.Popen([sys.executable, *plan.rank_args(str(run_dir.path))], env=env,
                                               stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                               start_new_session=True)
        with open(run_dir.path / "toy.json", "w") as f:  # proof that this backend started them
            f.write(__import__("json").dumps({str(r): p.pid for r, p in procs.items()}))
        return PopenJob(procs)


register(ToyBackend())
'''

RUN = """import sys
sys.path.insert(0, sys.argv[1])
import toy_backend  # noqa: F401  (registers cluster.launch=toy)
from launcher.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.integration
def test_a_toy_backend_launches_a_two_rank_job(tmp_path):
    package = tmp_path / "toy"
    package.mkdir()
    (package / "toy_backend.py").write_text(textwrap.dedent(TOY_BACKEND))
    args = ["recipe=quickstart", "smoke=true", "trainer.steps=3", "trainer.checkpoint_every=-1",
            "cluster.nproc_per_node=2", "cluster.launch=toy"]
    res = subprocess.run([sys.executable, "-c", RUN, str(package), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env={**__import__("os").environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = (tmp_path / "log_output" / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert sorted(json.loads((run_dir / "toy.json").read_text())) == ["0", "1"]
    for rank in (0, 1):
        assert (run_dir / f"rank.{rank}" / "metrics.jsonl").read_text().strip()
    assert "toy" not in BACKENDS  # registered in the launcher's process only


def test_the_name_check_finds_what_it_looks_for():
    names = set(BACKENDS)
    assert name_comparisons("if cfg.cluster.launch == 'mpi': pass", names) == [(1, "mpi")]
    assert name_comparisons("x = launch != 'elastic'", names) == [(1, "elastic")]
    assert name_comparisons("x = launch in ('local', 'slurm')", names) == [(1, "local"), (1, "slurm")]
    assert name_comparisons("match launch:\n    case 'slurm':\n        pass", names) == [(2, "slurm")]
    assert name_comparisons("d = {'mpi': 1}\nf(launch='local')", names) == []  # naming is not comparing


def test_no_code_outside_the_backends_package_compares_backend_names():
    offenders = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        if (LAUNCHER / "backends") in path.parents:
            continue
        offenders += [f"{path.relative_to(LAUNCHER.parent)}:{line}: {name}"
                      for line, name in name_comparisons(path.read_text(), set(BACKENDS))]
    assert not offenders, offenders
