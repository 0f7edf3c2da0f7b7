"""Where the Trainer's per-step time goes, against a hand-written DDP loop (issue 32: "the trainer's own per-step cost").

Run under torchrun (2 ranks, as P4 of bench/suite.py):

    .venv/bin/torchrun --standalone --nproc_per_node 2 bench/step_overhead.py [--steps 200] [--rounds 7]
    .venv/bin/python bench/step_overhead.py --micro      # each extra alone, in one process

Each rank builds the quickstart run exactly as a hetero-launch rank does (compose, gather the facts, plan for 2 ranks,
``build_trainer``: the engine, DDP, the optimizer, the data source), and beside it the hand loop of
bench/ddp_quickstart.py (its own DDP model, SGD, the same batches). Then, interleaved in rounds of ``--steps`` steps
each (the order rotates every round), it times:

- ``hand``: the hand loop;
- ``hand + X``: the hand loop with one thing the Trainer does more (X below), to see what each costs;
- ``train_step``: ``Trainer.train_step()`` alone;
- ``fit's step``: what ``Trainer.fit`` does per step: train_step, the finiteness check, the heartbeat, and every 20th
  step the logged record (the loss averaged over dp, a metrics.jsonl line).

Medians over rounds of each round's mean µs per step, their min-max, and each variant's extra over the hand loop;
the training thread's own CPU time per step (time.thread_time: what the Trainer's Python adds, less disturbed by
other processes than wall time) and its extras; and the ratio of the fastest rounds (on a shared machine the least
disturbed round of each variant is the fairest single figure); and the median of each round's own ratio to the hand
loop with its interquartile range (a round's variants run seconds apart: drift between rounds cancels). The sum of
the parts' extras next to the whole one says whether the list is complete. ``--only`` times the hand loop and the
variants named. Not a test: numbers belong to the machine; rank 0 prints them (and appends them to --out when given).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.facts.preflight import gather_facts  # noqa: E402
from launcher.config import compose_config  # noqa: E402
from launcher.facts.host import probe_host  # noqa: E402
from launcher.metrics_writer import MetricsWriter  # noqa: E402
from launcher.plan import plan_launch  # noqa: E402
from launcher.recipes.quickstart.data import FixedRandom  # noqa: E402
from launcher.recipes.quickstart.model import Network  # noqa: E402
from launcher.rundir import RunDir  # noqa: E402
from launcher.usercode.items import OutputLoss, move_to  # noqa: E402
from launcher.worker.evaluate import mean_over  # noqa: E402
from launcher.worker.mesh import build_mesh  # noqa: E402
from launcher.worker.train import build_trainer  # noqa: E402
from launcher.worker.divergence import LossWatch  # noqa: E402

LOG_EVERY = 20


def build(rank: int):
    """(trainer, hand): the Trainer a hetero-launch rank builds for recipe=quickstart on 2 ranks, and the hand loop's
    (model, optimizer, loss, batches)."""
    cfg = compose_config(["recipe=quickstart", "cluster.nproc_per_node=2", f"trainer.log_every={LOG_EVERY}"])
    plan = plan_launch(cfg, probe_host(), gather_facts(cfg, None))
    mesh, dp = build_mesh(plan.dims, "cpu")
    trainer = build_trainer(plan, dp, torch.device("cpu"), rank, mesh)
    torch.manual_seed(plan.seed)
    model = DDP(Network(32, 16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.1)
    batches = FixedRandom(64, 32, 16, 0).train_batches(rank, dist.get_world_size(), 16, plan.seed)
    torch.manual_seed(plan.seed)
    on_group = DDP(Network(32, 16, 16), process_group=dp.group)
    on_group_opt = torch.optim.SGD(on_group.parameters(), lr=0.2, momentum=0.1)
    on_group_batches = FixedRandom(64, 32, 16, 0).train_batches(rank, dist.get_world_size(), 16, plan.seed)
    return trainer, (model, opt, torch.nn.MSELoss(), batches), (on_group, on_group_opt, torch.nn.MSELoss(),
                                                                 on_group_batches)


def hand_step(hand, *, move=False, output_loss=None, detach=False, watch=None, beat=None, step=0):
    """One step of the hand loop, with the Trainer's extras switched on one at a time."""
    model, opt, loss_fn, batches = hand
    (x,), y = next(batches)
    if move:
        (x,), y = move_to((x,), torch.device("cpu"), torch.float32), move_to(y, torch.device("cpu"), torch.float32)
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = output_loss(out, y) if output_loss is not None else loss_fn(out, y)
    loss.backward()
    opt.step()
    if detach:
        loss = loss.detach().float()
    if watch is not None:
        watch.see(loss, step)
    if beat is not None:
        beat.step_done(step)
    return loss


def micro(out: str | None) -> None:
    """Each per-step extra of the Trainer timed alone in one process (timeit, the best of 7 repeats: on a shared
    machine the least disturbed repeat is the cost), on the quickstart's tensors."""
    import timeit

    x, y = torch.randn(16, 32), torch.randn(16, 16)
    out_t = torch.randn(16, 16)
    loss = torch.nn.functional.mse_loss(out_t, y)
    cpu = torch.device("cpu")
    watch = LossWatch(cpu, 0, 0.2)
    tmp = tempfile.mkdtemp(prefix="step_overhead_")
    beat = MetricsWriter(RunDir(tmp).rank(0))
    output_loss = OutputLoss(torch.nn.MSELoss(), "auto")
    cases = {
        "move_to (inputs tuple, labels)": lambda: (move_to((x,), cpu, torch.float32), move_to(y, cpu, torch.float32)),
        "OutputLoss over the loss itself": lambda: output_loss(out_t, y),
        "the loss alone (torch MSELoss)": lambda: torch.nn.functional.mse_loss(out_t, y),
        "loss.detach().float()": lambda: loss.detach().float(),
        "LossWatch.see (CPU: a float read)": lambda: watch.see(loss, 1),
        "bool(torch.isfinite(loss)) (before)": lambda: bool(torch.isfinite(loss)),
        "heartbeat step_done": lambda: beat.step_done(3),
    }
    lines = [f"bench/step_overhead.py --micro: each extra alone, best of 7 repeats (us per call)"]
    for name, fn in cases.items():
        n = 20000
        best = min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6
        lines.append(f"  {name:40s} {best:7.2f}")
    beat.close()
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="steps per variant and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", help="append rank 0's table to this file")
    ap.add_argument("--micro", action="store_true", help="time each extra alone in this process (no torchrun)")
    ap.add_argument("--only", nargs="+", default=[], metavar="VARIANT",
                    help="time only these variants beside the hand loop (e.g. \"fit's step\" train_step): more "
                         "rounds in the same time, each round's ratio closer to its pair")
    a = ap.parse_args()
    if a.micro:
        return micro(a.out)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainer, hand, on_group = build(rank)
    engine = trainer.engine
    theirs = (engine.chunk.call, engine.optimizer, torch.nn.MSELoss(), FixedRandom(64, 32, 16, 0).train_batches(
        rank, dist.get_world_size(), 16, trainer.plan.seed))
    tmp = tempfile.mkdtemp(prefix="step_overhead_")
    metrics = MetricsWriter(RunDir(tmp).rank(rank))
    output_loss = OutputLoss(torch.nn.MSELoss(), trainer.plan.model_output)

    watch = LossWatch(torch.device("cpu"), rank, 0.2)

    def fit_step(step: int) -> None:
        loss = trainer.train_step()
        watch.see(loss, step)
        metrics.step_done(step)
        if step % LOG_EVERY == 0:
            watch.check()
            metrics.write(step=step, loss=mean_over(loss, trainer.dp), local_loss=loss.item(), samples_per_s=0.0)

    variants = {
        "hand": lambda s: hand_step(hand),
        "hand, DDP on the mesh's dp group": lambda s: hand_step(on_group),
        "hand over the Trainer's DDP + SGD": lambda s: hand_step(theirs),
        "hand + move_to (inputs, labels)": lambda s: hand_step(hand, move=True),
        "hand + OutputLoss (model_output)": lambda s: hand_step(hand, output_loss=output_loss),
        "hand + loss.detach().float()": lambda s: hand_step(hand, detach=True),
        "hand + the loss's finiteness check": lambda s: hand_step(hand, watch=watch, step=s),
        "hand + heartbeat": lambda s: hand_step(hand, beat=metrics, step=s),
        "train_step": lambda s: trainer.train_step(),
        "fit's step": fit_step,
    }
    unknown = [n for n in a.only if n not in variants]
    if unknown:
        raise SystemExit(f"--only: no variant {', '.join(map(repr, unknown))}; the variants: "
                         f"{', '.join(map(repr, variants))}")
    names = ["hand"] + [n for n in variants if n != "hand" and (not a.only or n in a.only)]
    for name in names:  # warm up each (allocator, DDP's first-iteration bucket rebuild)
        for s in range(1, 31):
            variants[name](s)
    per: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.thread_time()
            for s in range(1, a.steps + 1):
                variants[name](s)
            per[name].append((time.perf_counter() - t0) / a.steps * 1e6)
            cpu[name].append((time.thread_time() - c0) / a.steps * 1e6)
    # Each rank's figure is its own; the step is collective, so rank 0's stands for both.
    metrics.close()
    if rank == 0:
        med = {n: statistics.median(v) for n, v in per.items()}
        mcpu = {n: statistics.median(v) for n, v in cpu.items()}
        base, cbase = med["hand"], mcpu["hand"]
        lines = [f"bench/step_overhead.py on {os.cpu_count()} cores, 2 ranks (gloo), recipe=quickstart "
                 f"(micro-batch 16 per rank), {a.rounds} rounds x {a.steps} steps per variant, interleaved; "
                 f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load average {os.getloadavg()[0]:.1f}",
                 f"{'variant':36s} {'us/step':>9s} {'min-max':>15s} {'extra':>8s} {'x hand':>7s} "
                 f"{'thread CPU us':>13s} {'extra':>8s} {'min x hand':>10s} {'round x hand':>18s}"]
        for n in names:
            v = per[n]
            paired = sorted(x / h for x, h in zip(v, per["hand"]))  # each round's own ratio: drift between rounds out
            lines.append(f"{n:36s} {med[n]:9.1f} {min(v):7.1f}-{max(v):<7.1f} {med[n] - base:+8.1f} "
                         f"{med[n] / base:7.3f} {mcpu[n]:13.1f} {mcpu[n] - cbase:+8.1f} "
                         f"{min(v) / min(per['hand']):10.3f} {statistics.median(paired):6.3f} "
                         f"({paired[len(paired) // 4]:.2f}-{paired[(3 * len(paired)) // 4]:.2f})")
        whole = mcpu.get("fit's step")
        if whole is not None:
            parts = sum(mcpu[n] - cbase for n in names if n.startswith("hand + "))
            lines.append(f"training thread's CPU: the parts' extras sum to {parts:+.1f} us; fit's step over hand "
                         f"{whole - cbase:+.1f} us")
        text = "\n".join(lines)
        print(text, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(text + "\n\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
