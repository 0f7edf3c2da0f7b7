"""The DataLoader each rank reads a user's Dataset with (``loader:``): worker processes, pinned memory, read-ahead.

``loader.num_workers=auto`` decides from facts gathered before the plan: how long the Dataset takes to read one item
(``DataFacts.item_seconds``, timed in preflight, and the share of that time spent on a CPU rather than waiting on a
file or the network, ``item_cpu_share``) and the host's cores per rank. A micro-batch that reads in under
``FAST_READ`` seconds gets no worker: handing a batch over from a worker process (pickled through shared memory) costs
about as much. A slower one gets one worker per core the rank has beyond its own, at most ``MAX_AUTO_WORKERS``; reading
that mostly waits gets ``WAITING_WORKERS`` even without spare cores (waiting takes no core).

Every key is checked for meaning: a value that would do nothing (pinned memory on the CPU, read-ahead without
workers) is refused with the reason, as is any loader key for a recipe whose data source makes whole batches itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAST_READ = 1e-3
"""Seconds: a micro-batch read faster than this gets no worker under auto."""
MAX_AUTO_WORKERS = 4
WAITING_WORKERS = 2
"""Workers auto gives reading that mostly waits (its CPU share under WAITING_SHARE), spare cores or not."""
WAITING_SHARE = 0.5
MAX_WORKERS = 256
"""More workers per rank than this is a typo (each is a process with its own copy of the Dataset)."""
DEFAULTS = {"num_workers": "auto", "pin_memory": "auto", "prefetch_factor": None, "persistent_workers": "auto"}


@dataclass(frozen=True)
class LoaderPlan:
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    why: str
    """How auto chose the workers ('' when given)."""

    def kwargs(self) -> dict[str, Any]:
        """torch.utils.data.DataLoader's keyword arguments."""
        out: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            out["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                out["prefetch_factor"] = self.prefetch_factor
        return out

    def line(self) -> str:
        what = (f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''} per rank"
                if self.num_workers else "read on the training thread (no workers)")
        extras = [x for x, on in (("pinned", self.pin_memory),
                                  (f"{self.prefetch_factor or 2} micro-batches ahead each", self.num_workers),
                                  ("kept between epochs", self.num_workers and self.persistent_workers)) if on]
        return f"loader: {what}{f' ({self.why})' if self.why else ''}{'; ' + ', '.join(extras) if extras else ''}"


def _flag(key: str, value: Any, problems: list[str]) -> bool | None:
    """auto -> None, a bool -> itself; anything else is a problem."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return value
    problems.append(f"loader.{key}={value!r}: give true, false or auto.")
    return None


def changed(loader: dict[str, Any]) -> list[str]:
    """The loader keys set to something other than their defaults (collate_fn included)."""
    keys = [k for k, v in DEFAULTS.items() if loader.get(k, v) != v]
    return (["collate_fn"] if loader.get("collate_fn") is not None else []) + keys


def _auto_workers(item_seconds: float, cpu_share: float, micro_size: int, cores: int, nproc: int) -> tuple[int, str]:
    per_rank = max(1, cores // max(1, nproc))
    read = item_seconds * micro_size
    took = f"a micro-batch of {micro_size} items reads in {read * 1e3:.2g} ms"
    if read < FAST_READ:
        return 0, f"auto: {took}, less than a worker's hand-over costs"
    if cpu_share < WAITING_SHARE:
        return WAITING_WORKERS, f"auto: {took}, {cpu_share:.0%} of it on a CPU (the rest waits)"
    workers = min(MAX_AUTO_WORKERS, per_rank - 1)
    if workers == 0:
        return 0, (f"auto: {took} on the training thread, and no core is spare ({nproc} rank(s) on {cores} cores); "
                   f"set loader.num_workers to read ahead anyway")
    return workers, f"auto: {took}; {per_rank} cores per rank"


def plan_loader(loader: dict[str, Any], user: bool, item_seconds: float, cpu_share: float, micro_size: int,
                cores: int, nproc: int, device_type: str, stream: bool = False) -> tuple[LoaderPlan | None, list[str]]:
    """The DataLoader settings of a recipe in the user's folder (``user``), or the problems. A ``stream`` (an
    IterableDataset) trains through one endless pass, whose workers live as long as the run: persistent workers
    would keep nothing."""
    problems: list[str] = []
    if not user:
        keys = [k for k in changed(loader) if k != "collate_fn"]  # collate_fn has its own message
        if keys:
            problems.append(f"loader.{', loader.'.join(keys)}: this recipe's data source makes whole batches itself, "
                            f"in the rank, so a DataLoader's settings would do nothing. Remove them; they are for a "
                            f"recipe in your folder whose data is a Dataset. (data=tabular over a directory of "
                            f"Parquet files reads ahead on a thread of its own: data.prefetch windows.)")
        return None, problems
    workers, why = loader["num_workers"], ""
    if workers == "auto":
        workers, why = _auto_workers(item_seconds, cpu_share, micro_size, cores, nproc)
    elif isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= MAX_WORKERS:
        problems.append(f"loader.num_workers={workers!r}: give auto or a whole number of worker processes per rank, "
                        f"0 (read on the training thread) to {MAX_WORKERS}.")
        workers = 0
    pin = _flag("pin_memory", loader["pin_memory"], problems)
    if pin and device_type != "cuda":
        problems.append("loader.pin_memory=true: pinned (page-locked) memory speeds copies to a GPU; this run is on the "
                        "CPU, where it would do nothing. Remove it (auto pins with CUDA).")
    keep = _flag("persistent_workers", loader["persistent_workers"], problems)
    if keep and stream:
        problems.append("loader.persistent_workers=true: the train data is a stream (IterableDataset), read in one "
                        "endless pass whose workers live as long as the run (and each evaluation reads its data once), "
                        "so there is nothing to keep between epochs. Remove it.")
    ahead = loader["prefetch_factor"]
    if ahead is not None and (isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 1):
        problems.append(f"loader.prefetch_factor={ahead!r}: give a whole number >= 1 of micro-batches each worker "
                        f"reads ahead, or null (torch's default, 2).")
    for key, value in (("prefetch_factor", ahead), ("persistent_workers", keep or None)):
        if value is not None and workers == 0 and not problems:
            problems.append(f"loader.{key}={value}: it applies to worker processes, and this run has none "
                            f"(loader.num_workers={loader['num_workers']}{f'; {why}' if why else ''}). Set "
                            f"loader.num_workers >= 1, or remove loader.{key}.")
    if problems:
        return None, problems
    return LoaderPlan(num_workers=workers, pin_memory=device_type == "cuda" if pin is None else pin,
                      prefetch_factor=ahead, persistent_workers=not stream if keep is None else keep, why=why), []

