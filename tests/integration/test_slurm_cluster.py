"""The Slurm test cluster works: a 2-task sbatch job whose srun step sees its rank variables."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import slurm_cluster  # noqa: F401

pytestmark = pytest.mark.integration

# What a task gets from srun: printed (pytest -s) so the launcher can map them; PROCID/LOCALID/NTASKS asserted below.
TASK = ("import os; print('TASK', os.environ['SLURM_PROCID'], os.environ['SLURM_LOCALID'], os.environ['SLURM_NTASKS']);"
        " [print('ENV', k, v) for k, v in sorted(os.environ.items()) if k.startswith(('SLURM_', 'PMI'))"
        " and os.environ['SLURM_PROCID'] == '0']")


def test_sbatch_two_tasks(slurm_cluster, tmp_path):  # noqa: F811
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=1 --ntasks=2
#SBATCH --output={out}
#SBATCH --time=2
srun python3 -c "{TASK}"
""")
    rc, job_id = slurm_cluster.sbatch_wait(script, cwd=tmp_path, timeout=60)
    text = out.read_text() if out.exists() else "(no output)"
    print(text)
    assert rc == 0, f"job {job_id} rc={rc}\n{text}\n{slurm_cluster.tail_logs()}"
    tasks = sorted(line.split()[1:] for line in text.splitlines() if line.startswith("TASK "))
    assert tasks == [["0", "0", "2"], ["1", "1", "2"]], text
    env = dict(line.split(" ", 2)[1:] for line in text.splitlines() if line.startswith("ENV ") and line.count(" ") >= 2)
    assert env["SLURM_JOB_ID"] == job_id
    assert env["SLURM_NNODES"] == "1"
    assert env.get("SLURM_TASKS_PER_NODE", env.get("SLURM_NTASKS_PER_NODE")) == "2"
    assert env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST")) == slurm_cluster.node
