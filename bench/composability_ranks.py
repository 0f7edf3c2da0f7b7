"""One rank of the composability matrix (bench/composability.py starts it with ``hetero-launch script=``): every plan
in a JSON file, in turn, in this one process, through the worker's own code: the mesh (``build_mesh``), the model
with its parts applied (``build_trainer``: pipeline split, tables, tensor parallel, recompute, data parallel), N
optimizer steps (``Trainer.train_step``) and an evaluation (``Trainer.evaluate``). The process group, torch and
DeepSpeed are set up once for all plans: that is what lets a test train some eighty layouts in a few minutes.

    python bench/composability_ranks.py PLANS.json OUT.json STEPS

Writes OUT.json (rank 0): {key: {"losses": [mean over dp, per step], "eval": {...}, "held": [per rank: the bytes of
parameters, optimizer states and tables it holds], "seconds": s}}. A plan that fails
on a rank writes OUT.json.error.<rank> (the plan's key and the traceback) and ends the rank with exit code 1: the
launcher then stops the others (which would wait in a collective the failed rank never issues).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from launcher.fastexit import fast_exit
from launcher.plan import LaunchPlan
from launcher.worker.accounting import measure_memory
from launcher.worker.evaluate import mean_over
from launcher.worker.mesh import build_mesh
from launcher.worker.train import build_trainer


MESHES: dict = {}
"""One mesh per shape, made once: a recipe rank makes one, this process runs ~80 plans, and every mesh's gloo groups
keep their threads (made afresh per plan: 900 threads a rank and a load average of 600 on 2 cores). Destroying a
plan's groups after it ran was tried: a later tensor-parallel plan then asked for a destroyed group by name."""


def run_plan(plan: LaunchPlan, rank: int, steps: int) -> dict:
    t0 = time.perf_counter()
    sys.path[:0] = [p for p in plan.code_paths if p not in sys.path]  # a user's recipe code, by _target_
    if plan.dims not in MESHES:
        MESHES[plan.dims] = build_mesh(plan.dims, "cpu")
    mesh, dp = MESHES[plan.dims]
    trainer = build_trainer(plan, dp, torch.device("cpu"), rank, mesh)
    losses = [mean_over(trainer.train_step(), dp) for _ in range(steps)]
    held = measure_memory(trainer.engine, trainer.tables, plan.placement)  # what this rank holds after a step
    result = {"losses": losses, "eval": trainer.evaluate() if plan.eval_batches else None}
    mine = {kind: held["host"][kind] + held["device"][kind] for kind in ("params", "optimizer", "tables")}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {**result, "held": every, "seconds": round(time.perf_counter() - t0, 2)}


def main(plans_path: str, out_path: str, steps: int) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    plans = json.loads(open(plans_path).read())
    results: dict[str, dict] = {}
    for key, d in plans.items():
        try:
            results[key] = run_plan(LaunchPlan.from_dict(d), rank, steps)
        except Exception as e:  # noqa: BLE001 - recorded for the matrix; the launcher stops the other ranks
            error = {"key": key, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
            with open(f"{out_path}.error.{rank}", "w") as f:
                json.dump(error, f)
            print(f"rank {rank}: {key} failed:\n{error['traceback']}", file=sys.stderr, flush=True)
            sys.stderr.flush()
            os._exit(1)
        if rank == 0:
            print(f"{key}: {results[key]['losses']} ({results[key]['seconds']} s)", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    # As the recipe worker ends (launcher/worker/__main__.py): the interpreter's teardown can destroy gloo's threads
    # still joinable and die of SIGABRT ("terminate called without an active exception") after the results are
    # written, which failed the matrix tests now and then on a fresh clone.
    fast_exit(0)
