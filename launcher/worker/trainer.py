"""The training loop as an object with state (torchtitan's Stateful Trainer).

``Trainer`` drives an engine (launcher/parallel/engine.py: whatever parts were composed) and, where the plan keeps
tables outside the parts, a table store. ``state_dict()`` / ``load_state_dict()`` cover everything a resumed run
needs: the engine's model and optimizer, the tables and their optimizers' states (step counts included), the data
position and the RNG states; ``save`` / ``load`` write and read the same to a checkpoint dir (the engine's part
through DCP, or DeepSpeed's own files; the tables through DCP), and resuming is a ``load``, not a second code path.
One limit: a DeepSpeed engine that shards or wraps its state (ZeRO 1-3, bf16) has no in-memory state dict here; its
part of ``save``/``load`` is DeepSpeed's own sharded checkpoint (``Engine.save``), and ``state_dict()`` raises."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from launcher.manifest import file_record, list_files, share_of
from launcher.parallel.engine import DTYPES, Engine
from launcher.parallel.choose import checkpoint_layout
from launcher.plan import LaunchPlan
from launcher.metrics_writer import MetricsWriter
from launcher.rundir import CheckpointDir, RankDir, RunDir
from launcher.tables import TableStore
from launcher.tables.lookup import hash_report
from launcher.usercode.items import call, move_to
from launcher.worker.accounting import SavedActivations, StepTracker, measure_memory, measure_peak
from launcher.worker.divergence import LossWatch
from launcher.worker.host_modules import HOST_MODULES, HostModules
from launcher.worker.early_stop import EarlyStop, finish as finish_early_stop, validate
from launcher.worker.evaluate import evaluate, mean_over
from launcher.worker.mesh import DataParallel
from launcher.worker.verify import verify_checkpoint


class Trainer:
    def __init__(self, plan: LaunchPlan, engine: Engine, tables: TableStore | None, loss_fn, data, dp: DataParallel,
                 device: torch.device, rank: int, hosted: HostModules | None = None) -> None:
        self.plan, self.engine, self.tables, self.hosted = plan, engine, tables, hosted
        self.loss_fn, self.data, self.dp, self.device, self.rank = loss_fn, data, dp, device, rank
        self.dtype = DTYPES[plan.precision]
        self.step = 0
        """Optimizer steps done."""
        self.data_position = 0
        """Global micro-batches consumed (the data source restarts there after a load)."""
        self._batches = None
        self.saved_activation_bytes: int | None = None
        """Bytes autograd saved for backward in the run's first micro-batch (parameters excluded)."""
        self.memory_marks: dict[str, int] = {}
        """This rank's RSS at marks the launching code took before fit ("rss_at_start", "rss_after_build"), bytes."""
        self.track_memory = False
        """Run the first step of fit under torch's MemTracker (its split of the peak by kind goes to memory.json).
        Off by default: the tracker raises the rank's peak RSS, the figure the plan is checked against (StepTracker)."""
        self._memory: dict[str, Any] | None = None
        """memory.json's record of the first step fit ran (None before it)."""
        self._tracker: StepTracker | None = None
        """While the first step runs under it."""
        self.alive: Callable[[], None] = lambda: None
        """Called between the parts of long work that is not a step (evaluation batches, a checkpoint's parts): fit
        sets it to the heartbeat's MetricsWriter.alive, so the launcher's watchdog sees progress."""
        self.saving: Callable[[], AbstractContextManager[None]] = nullcontext
        """Around a checkpoint's save: fit sets it to MetricsWriter.saving (the heartbeat says "saving" and a thread
        keeps it moving, so a save longer than launcher.watchdog_s is not taken for a hang)."""
        self.step_end: Callable[[], None] = lambda: None
        """Called after each step: run_rank sets it to the allocator's (launcher/worker/heap.py release_hook: what
        tcmalloc holds free beyond 256 MiB goes back to the kernel)."""
        self._lookahead = self._build_lookahead()
        self.early = EarlyStop(plan.early_stop) if plan.early_stop is not None else None
        """trainer.early_stop's state (launcher/worker/early_stop.py); None without early stopping."""
        self.saved_step = -1
        """The step of the last checkpoint this trainer wrote (a step's checkpoint is written once)."""

    # -- one step ---------------------------------------------------------------------------------------------------
    def forward(self, batch):
        """One micro-batch forward: inputs to the device (tables outside the engine look their rows up where they
        live, inside the model's forward). Returns (output, labels on the device)."""
        inputs, labels = self._move(batch)
        return call(self.engine, inputs), labels

    def _move(self, batch):
        """(inputs, labels) of a micro-batch on the device, floats in the run's dtype; inputs a tuple (positional)
        or a dict (keyword)."""
        inputs, labels = batch
        return move_to(inputs, self.device, self.dtype), move_to(labels, self.device, self.dtype)

    def _next_batch(self):
        if self._batches is None:
            b = self.plan.batch
            self._batches = self.data.train_batches(self.dp.rank, self.dp.size, b.micro_size, self.plan.seed,
                                                    start=self.data_position)
        self.data_position += 1
        return next(self._batches)

    def train_step(self) -> torch.Tensor:
        """grad_accum micro-batches and one optimizer step; returns this rank's mean loss (a tensor, not synced)."""
        accum = self.plan.batch.grad_accum
        if getattr(self.engine, "drives_schedule", False):  # a pipeline: its schedule runs the step's micro-batches
            return self._pipeline_step(accum)
        total = None
        for _ in range(accum):
            if self._tracker is not None:
                self._tracker.next_micro_batch()
            if self.saved_activation_bytes is None:  # measured once, on the first micro-batch of the run
                with SavedActivations(self.engine.module) as saved:  # the model's forward (the loss's not counted)
                    out, labels = self.forward(self._micro_batch())
                self.saved_activation_bytes = saved.bytes
            else:
                out, labels = self.forward(self._micro_batch())
            loss = self.loss_fn(out, labels)
            self.engine.backward(loss)
            if self.tables is not None:
                self.tables.collect(self.engine.loss_scale)  # read before step() may change the scale
            if self.hosted is not None:
                self.hosted.collect(self.engine.loss_scale)
            self.engine.step()
            loss = loss.detach().float()
            total = loss if total is None else total + loss
        self._step_tables()
        self.step += 1
        return total / accum if accum > 1 else total

    # -- host-table prefetch (placement.prefetch; launcher/tables/record.py, prefetch.py) ------------------------------
    def _build_lookahead(self) -> Any:
        """A Lookahead when the plan prefetches and the store has tables it can prefetch (replicated host tables)."""
        depth = getattr(self.plan.placement, "prefetch", 0)
        if (self.tables is None or depth <= 0 or not hasattr(self.tables, "start_prefetch")
                or not self.tables.start_prefetch()):
            return None
        from launcher.tables.record import Lookahead

        return Lookahead(self.tables, depth, self.device, self.dtype, self.plan.batch.grad_accum)

    def _micro_batch(self):
        """The micro-batch to train on now. With prefetch, the next ones are drawn ahead (moved to the device) and
        the store gathers their rows while this one steps; data_position still counts the micro-batches trained."""
        if self._lookahead is None:
            return self._next_batch()
        batch, drawn = self._lookahead.take(lambda: self._move(self._next_batch()),
                                            lambda b: call(self.engine.module, b[0]))
        self.data_position += 1 - drawn  # _next_batch counted each one drawn
        return batch

    def _step_tables(self) -> None:
        """The tables and the host modules (placement.modules) step after the parts (or skip with them)."""
        if self.hosted is not None:
            self.hosted.discard() if self.engine.step_skipped else self.hosted.step()
        if self.tables is None:
            return
        if self.engine.step_skipped:  # fp16 overflow: the network skipped this step, so do the tables
            self.tables.discard()
        else:
            self.tables.step()  # skips by itself when the tables' own gradients overflowed

    def _pipeline_step(self, accum: int) -> torch.Tensor:
        """One optimizer step of a pipeline: every rank draws the step's micro-batches (so every stage's data
        position moves alike; the first stage feeds the inputs, the last the labels). The tables of this rank's
        stages have their rows' gradients of every micro-batch once the schedule is done."""
        batches = [self._move(self._next_batch()) for _ in range(accum)]
        if self.saved_activation_bytes is None:  # this stage's forwards of the first step, per micro-batch
            with SavedActivations(self.engine.module) as saved:
                loss = self.engine.train_batch(batches)
            self.saved_activation_bytes = saved.bytes // accum
        else:
            loss = self.engine.train_batch(batches)
        if self.tables is not None:
            self.tables.collect(self.engine.loss_scale)
        if self.hosted is not None:
            self.hosted.collect(self.engine.loss_scale)
        self._step_tables()
        self.step += 1
        return loss.detach().float()

    def evaluate(self, split: str = "test") -> dict[str, Any]:
        return evaluate(self, split)

    def _lr(self) -> dict[str, float]:
        """{"lr": the dense optimizer's learning rate now (its first param group's)}; {} when it has none (a
        pipeline stage that holds only tables)."""
        try:
            return {"lr": float(self.engine.optimizer.param_groups[0]["lr"])}
        except (AttributeError, IndexError, KeyError, TypeError):
            return {}

    def _grad_norm(self) -> dict[str, float]:
        """{"grad_norm": the last step's global gradient norm before clipping} when the run clips (trainer.grad_clip;
        every rank of a step has the same); {} otherwise."""
        norm = getattr(self.engine, "grad_norm", None)
        return {"grad_norm": float(norm)} if norm is not None else {}

    # -- the loop ---------------------------------------------------------------------------------------------------
    def fit(self, run_dir: RunDir, rank_dir: RankDir, metrics: MetricsWriter) -> None:
        """Train from self.step to plan.steps: metrics, evaluations and checkpoints as planned."""
        p = self.plan
        self.alive, self.saving = metrics.alive, metrics.saving
        fail_rank, fail_step = p.debug_fail
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            fail_rank = -1  # debug.fail_* fails the first attempt only: a restart goes on
        tick, tick_step = time.perf_counter(), self.step
        first = self.step + 1  # 1, or the step after the checkpoint a resumed run loaded
        watch = LossWatch(self.device, self.rank, p.optimizer.lr)  # a diverged run stops (divergence.py)
        stopped = self.early is not None and self.early.stopped  # a resumed run whose checkpoint had stopped
        while self.step < p.steps and not stopped:
            loss, tracked = self._first_step() if self.step + 1 == first else (self.train_step(), None)
            step = self.step
            watch.see(loss, step)
            if step == first:  # optimizer states exist from the first step on
                self.write_memory(run_dir, rank_dir, tracked)
            metrics.step_done(step)
            self.step_end()
            if step == first or step % p.log_every == 0 or step == p.steps:
                watch.check()
                local, mean = loss.item(), mean_over(loss, self.dp)
                now = time.perf_counter()
                rate = (step - tick_step) * p.batch.global_size / (now - tick)
                metrics.write(step=step, loss=mean, local_loss=local, samples_per_s=round(rate, 1), **self._lr(),
                              **self._grad_norm())
                tick, tick_step = now, step
            if p.eval_every > 0 and step % p.eval_every == 0 and step != p.steps and p.eval_batches > 0:
                watch.check()
                metrics.write(event="eval", step=step, **self.evaluate())
                tick = time.perf_counter()  # evaluation time is not training throughput
            if p.val_every > 0 and (step % p.val_every == 0 or step == p.steps):
                watch.check()
                stopped = validate(self, run_dir, metrics, step)
                tick = time.perf_counter()
            if p.checkpoint_every > 0 and step % p.checkpoint_every == 0 and step != p.steps and not stopped:
                watch.check()
                self.save(run_dir.checkpoint(step))
                tick = time.perf_counter()
            if self.rank == fail_rank and step == fail_step:  # after the step is logged: its loss is on record
                raise RuntimeError(f"debug.fail_rank={fail_rank} debug.fail_step={fail_step}: injected failure")
        watch.check()
        self._finish(run_dir, rank_dir, metrics)

    def _finish(self, run_dir: RunDir, rank_dir: RankDir, metrics: MetricsWriter) -> None:
        """After the last step (trainer.steps, or where early stopping stopped): the last checkpoint, the test split
        scored (on the best checkpoint's weights with early stopping), the tables' digests, the memory record."""
        p, last = self.plan, self.step
        if p.checkpoint_every >= 0:  # before the evaluation: a failing evaluation loses no training
            if self.saved_step != last:  # a best checkpoint may be this step's already
                self.save(run_dir.checkpoint(last))
            if p.smoke:
                self.verify_checkpoint(run_dir.checkpoint(last))
                metrics.write(event="checkpoint_verified", step=last)
        finish_early_stop(self, run_dir, metrics)
        if p.eval_batches > 0:
            metrics.write(event="eval", step=last, **self.evaluate())
        if self.tables is not None:
            rank_dir.tables.write_text(json.dumps(self.tables.digests(), indent=2))
            if self.tables.huge_pages is not None:  # rank.N/stderr: what the background collapse got done
                print(f"rank {self.rank}: {self.tables.huge_pages.words()}", file=sys.stderr, flush=True)
            if self._lookahead is not None:
                metrics.write(event="prefetch", step=p.steps, **self.tables.prefetch_stats())
            hashing = hash_report(self.engine.module)
            if hashing:
                run_dir.write_json(rank_dir.hashing, hashing)
        if self._memory is not None:  # the peak now covers every step, evaluation and save
            self.write_memory(run_dir, rank_dir)

    def _first_step(self) -> tuple[torch.Tensor, dict[str, dict[str, int]] | None]:
        """train_step, under torch's MemTracker when ``track_memory`` and the engine is no pipeline (whose schedule
        runs the micro-batches): (loss, the tracker's split of the step's peak, or None)."""
        if not self.track_memory or getattr(self.engine, "drives_schedule", False):
            return self.train_step(), None
        with StepTracker(self.engine, self.tables) as self._tracker:
            loss = self.train_step()
        tracker, self._tracker = self._tracker, None
        return loss, tracker.split

    def write_memory(self, run_dir: RunDir, rank_dir: RankDir, tracked: dict[str, Any] | None = None) -> None:
        """rank.N/memory.json (replaced whole): the first call measures the tensors by kind and place, the bytes
        autograd saved and MemTracker's split ("tracker", when given); every call adds the peak so far ("peak")."""
        if self._memory is None:
            self._memory = measure_memory(self.engine, self.tables, self.plan.placement)
            self._memory["activations"] = {"saved_bytes_per_micro_batch": self.saved_activation_bytes,
                                           "recompute": list(self.plan.recompute)}
            if tracked is not None:
                self._memory["tracker"] = {"step": self.step, "peak": tracked}
            if self.hosted is not None:  # placement.modules: on the host, beside what the parts hold
                self._memory["host_modules"] = self.hosted.held_bytes()
        peak = measure_peak(self.memory_marks, self.device, self.step)
        run_dir.write_json(rank_dir.memory, {**self._memory, "peak": peak})

    # -- state ------------------------------------------------------------------------------------------------------
    def _progress(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        early = {"early_stop": self.early.state_dict()} if self.early is not None else {}
        return {"step": self.step, "data_position": self.data_position, "rng": rng, **early}

    def _load_progress(self, state: dict[str, Any]) -> None:
        self.step, self.data_position = int(state["step"]), int(state["data_position"])
        self._batches = None  # restart the data source at data_position
        if self._lookahead is not None:
            self._lookahead.clear()  # what was drawn ahead is drawn again from there
        if self.early is not None and state.get("early_stop") is not None:
            self.early.load_state_dict(state["early_stop"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs, in memory (the engine's part as Engine.state_dict gives it). Tensors are
        references to the live state, as in torch: ``copy.deepcopy`` it to keep a snapshot while training goes on."""
        return {
            **self._progress(),
            "engine": self.engine.state_dict(),
            "tables": self.tables.state_dict() if self.tables is not None else None,
            "host_modules": self.hosted.state_dict() if self.hosted is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        if self.tables is not None:
            self.tables.load_state_dict(state["tables"])
        if self.hosted is not None:
            self.hosted.load_state_dict(state["host_modules"])
        self._load_progress(state)

    def _tables_state(self) -> dict[str, Any]:
        return {"tables": self.tables.state_dict() if self.tables is not None else {}}

    def save(self, ckpt: CheckpointDir) -> None:
        """Write a checkpoint (collective): the engine's part (DCP, or DeepSpeed's own files), the tables (DCP: one
        copy of each, by name, whichever stage holds it), each rank's progress and RNG; last checkpoint.json with
        the manifest of every file. The heartbeat says "saving" and keeps moving meanwhile (``self.saving``)."""
        import torch.distributed.checkpoint as dcp

        with self.saving():
            self.engine.save(ckpt)
            self.alive()
            ckpt.path.mkdir(parents=True, exist_ok=True)
            if self.plan.placement.sparse_tables:
                dcp.save(self._tables_state(), checkpoint_id=str(ckpt.tables))
                self.alive()
            if self.hosted is not None:
                dcp.save(self.hosted.state_dict(), checkpoint_id=str(ckpt.path / HOST_MODULES))
            torch.save(self._progress(), ckpt.trainer(self.rank))
            dist.barrier()
            files = self._manifest(ckpt)
            if self.rank == 0:  # last, once every rank's part is on disk: a resume trusts a checkpoint that has it
                tmp = ckpt.meta.with_suffix(".tmp")
                tmp.write_text(json.dumps({"step": self.step, **checkpoint_layout(self.plan), "files": files},
                                          indent=2))
                os.replace(tmp, ckpt.meta)
            dist.barrier()
        self.saved_step = self.step

    def _manifest(self, ckpt: CheckpointDir) -> dict[str, dict[str, Any]]:
        """Every file of a written checkpoint with its bytes and CRC-32 (collective, once every rank's part is on
        disk): each rank lists the files it sees and checksums its share of them; rank 0 gets the whole ({} on the
        others)."""
        world = dist.get_world_size()
        seen: list[Any] = [None] * world
        dist.all_gather_object(seen, list_files(ckpt.path, skip=(ckpt.meta.name, ckpt.meta.with_suffix(".tmp").name)))
        mine = {rel: file_record(ckpt.path / rel) for rel in share_of(seen, self.rank)}
        parts: list[Any] | None = [None] * world if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        return dict(sorted((rel, rec) for part in parts or () for rel, rec in part.items()))

    def verify_checkpoint(self, ckpt: CheckpointDir) -> None:
        """Read a just-written checkpoint back and check that it restores exactly the state it saved (smoke runs;
        launcher/worker/verify.py)."""
        verify_checkpoint(self, ckpt)

    def load(self, ckpt: CheckpointDir) -> None:
        """Read a checkpoint, also one saved on another layout (DCP reshards; a rank that did not exist then takes
        rank 0's progress, the same on every rank, and its RNG)."""
        import torch.distributed.checkpoint as dcp

        self.engine.load(ckpt)
        if self.plan.placement.sparse_tables:
            state = self._tables_state()
            dcp.load(state, checkpoint_id=str(ckpt.tables))
            if self.tables is not None:
                self.tables.load_state_dict(state["tables"])
        if self.hosted is not None:
            state = self.hosted.state_dict()
            dcp.load(state, checkpoint_id=str(ckpt.path / HOST_MODULES))
            self.hosted.load_state_dict(state)
        mine = ckpt.trainer(self.rank)
        self._load_progress(torch.load(mine if mine.exists() else ckpt.trainer(0), map_location="cpu",
                                       weights_only=True))
