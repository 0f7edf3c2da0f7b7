"""The memory model (pure): what one rank holds at its peak, term by term, and what a host holds with its ranks.

Every term says where it lives (host or device), when it is alive (``always``; ``backward``: activations and the
buffers of the forward and backward; ``step``: the optimizer steps' temporaries; ``save``: a checkpoint's), and how it
is known: ``exact`` (counted from the model's shapes and the parts' rules), ``traced`` (activations, from a forward on
the meta device), ``estimate`` (a count of temporaries read from the code that makes them) or ``constant``
(launcher/constants.py, with its source). A location's peak is its ``always`` terms plus its largest phase.

On a CPU-only host the device is host memory: a rank's resident set is both locations together, and the host's
budget holds every rank's whole peak; the device budget still bounds what the plan put "on the device" (what a GPU
would hold), which is how placement is planned and tested on CPU."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from launcher import constants as C
from launcher.plan.memory import MemoryEstimate
from launcher.plan.ps import rows_per_rank
from launcher.plan.registry import DENSE_OPTIMIZERS, TABLE_OPTIMIZERS, table_state_bytes
from launcher.units import Term

PHASES = ("backward", "step", "save")
STATE_TERMS = {"params": "dense parameters", "grads": "dense gradients", "optimizer": "dense optimizer states and "
               "fp32 master weights", "tables": "embedding tables", "table_states": "their optimizers' states",
               "gathered": "parameters a sharded part holds whole during a step"}
TABLE_STEP_TEMPS = {"lazy_adam": 6, "sparse_adam": 6, "ftrl": 9, "sgd": 2, "momentum": 3}
"""Row-sized temporaries a table optimizer's step makes (launcher/tables/sparse_optim.py: lazy_adam gathers the
weight rows and both moments, and its sqrt/div make two more; ftrl gathers three and computes six), besides the
gradient rows themselves."""
DENSE_STEP_TEMPS = 1.0
"""Parameter-sized temporaries of a dense optimizer's step (torch's foreach Adam: the sqrt of exp_avg_sq)."""


@dataclass(frozen=True)
class MemoryInput:
    """What the memory model reads of a plan (all of it pure data)."""

    estimate: MemoryEstimate
    device_type: str
    nproc_per_node: int
    micro_size: int
    grad_accum: int
    in_flight: int = 1
    """Micro-batches whose activations a rank holds at once (a pipeline schedule's in-flight count; 1 without)."""
    activation_bytes: int | None = None
    """Bytes kept for the backward per micro-batch (with the planned recompute); None = not traced."""
    tables: tuple = ()
    """The plan's TablePlans (those outside the parts have host/device locations)."""
    lookups: dict[str, float] = field(default_factory=dict)
    """Rows each sample looks up per table (default 1)."""
    prefetch: int = 0
    """Micro-batches whose host-table rows are gathered ahead (placement.prefetch)."""
    optimizer: str = "adam"
    optimizer_location: str = "device"
    buffers: tuple[Term, ...] = ()
    """The parallel parts' own buffers (buckets, prefetch), from each part's ``buffers``."""
    data_bytes: int = 0
    """The data set a rank holds in memory (DataFacts.resident_bytes)."""
    deepspeed: bool = False
    warm: bool = False
    """The rank is forked from the warm-start forkserver (a smaller runtime: WARM_RANK_RUNTIME)."""
    families: tuple[str, ...] = ()
    """Operator kinds the model runs whose CPU kernels cost memory of their own (conv)."""
    imports: tuple[int, str] = (0, "")
    """(bytes, what) importing the user's code adds to a rank (measured in the launcher's preflight)."""
    table_terms: tuple[Term, ...] | None = None
    """The tables' terms when already computed (``table_terms``): they do not depend on the dense layout, and
    placement=auto evaluates many layouts of the same tables."""
    per_table: bool = True
    """Each table as terms of its own (movable one by one); False: the estimate's totals (a pipeline's busiest
    stage holds only some tables)."""


@dataclass(frozen=True)
class MemoryPlan:
    terms: tuple[Term, ...]
    """One rank's terms (the busiest rank of a pipeline)."""
    device_type: str
    nproc_per_node: int
    launcher: int = int(C.LAUNCHER_RUNTIME.value)
    forkserver: int = 0
    """The warm-start forkserver's RSS while the ranks run (FORKSERVER_RUNTIME); 0 = the ranks start cold."""

    def peak(self, where: str) -> int:
        """Bytes at the peak in ``where`` (host or device) for one rank: training's, or building the model's."""
        return max(self._peaks[where], self._build[where])

    @functools.cached_property
    def _sums(self) -> dict[str, dict[str, int]]:
        return phase_sums(self.terms)

    @functools.cached_property
    def _peaks(self) -> dict[str, int]:
        """{host, device, both}: each peak while training, from one pass over the terms (a plan may have 40,000)."""
        return peaks_of(self._sums)

    @functools.cached_property
    def _build(self) -> dict[str, int]:
        """{host, device, both}: each location while the model is built (``build`` terms; 0 without any)."""
        return build_peaks(self._sums)

    @property
    def rank_peak(self) -> int:
        """One rank's resident peak on a CPU host (both locations are host memory): what the run measures as RSS.
        On a GPU host: its host peak."""
        return self.peak("both") if self.device_type == "cpu" else self.peak("host")

    @property
    def training_peak(self) -> int:
        """rank_peak while training (without building the model)."""
        return self._peaks["both" if self.device_type == "cpu" else "host"]

    @property
    def build_extra(self) -> int:
        """What one rank building the model (sharded tables built whole) holds beyond its training peak."""
        return max(0, self._build["both" if self.device_type == "cpu" else "host"] - self.training_peak)

    @property
    def host_runtime(self) -> int:
        """What a host holds besides its ranks: the launcher and the warm-start forkserver."""
        return self.launcher + self.forkserver

    @property
    def host_total(self) -> int:
        """One host: its ranks' peaks, the launcher and its forkserver (host_total_of)."""
        return host_total_of(self._sums, self.device_type, self.nproc_per_node, self.host_runtime)

    @property
    def measured_as(self) -> tuple[str, int]:
        """(the key of rank.N/memory.json's "peak" this plan predicts, the predicted bytes): a CPU rank's resident
        peak ("rss"); on a GPU, torch's max_memory_reserved (the device peak less the CUDA context, which torch's
        allocator does not see)."""
        if self.device_type == "cpu":
            return "rss", self.rank_peak
        context = sum(t.bytes for t in self.terms if t.name == "cuda context")
        return "device_max_reserved", self.peak("device") - context


def phase_sums(terms) -> dict[str, dict[str, int]]:
    """Bytes per location and phase: what a peak is made of, kept by placement=auto to update as tables move."""
    sums = {w: dict.fromkeys(("always", *PHASES, "build"), 0) for w in ("host", "device")}
    for t in terms:
        sums[t.where][t.phase] += t.bytes
    return sums


def peaks_of(sums: dict[str, dict[str, int]]) -> dict[str, int]:
    """{host, device, both}: each location's ``always`` plus its largest phase; both: one memory (a CPU host)."""
    both = {p: sums["host"][p] + sums["device"][p] for p in sums["host"]}
    return {w: s["always"] + max(s[p] for p in PHASES) for w, s in (*sums.items(), ("both", both))}


def build_peaks(sums: dict[str, dict[str, int]]) -> dict[str, int]:
    """{host, device, both} while the model is built: ``always`` plus the ``build`` terms (0 without any)."""
    if not sums["host"]["build"] and not sums["device"]["build"]:
        return {"host": 0, "device": 0, "both": 0}
    built = {w: s["always"] + s["build"] for w, s in sums.items()}
    return {**built, "both": built["host"] + built["device"]}


def host_total_of(sums: dict[str, dict[str, int]], device_type: str, nproc: int, launcher: int) -> int:
    """One host from phase_sums of one rank's terms: its ranks at their training peak, the launcher, and what one
    rank building the model holds beyond that (a host's ranks build it one at a time with sharded tables)."""
    key = "both" if device_type == "cpu" else "host"
    training = peaks_of(sums)[key]
    return nproc * training + max(0, build_peaks(sums)[key] - training) + launcher


def memory_plan(m: MemoryInput) -> MemoryPlan:
    """The terms of one rank (and so its host) for ``m``."""
    tables = list(m.table_terms) if m.table_terms is not None else table_terms(m)
    terms = _states(m.estimate, per_table=m.per_table) + tables + _runtime(m) + _activations(m) + _dense_step(m)
    terms += _built_whole(m)
    terms += list(m.buffers)
    if m.data_bytes:
        terms.append(Term("data", "host", m.data_bytes, source="the data set each rank holds (its train split)"))
    return MemoryPlan(terms=tuple(t for t in terms if t.bytes > 0), device_type=m.device_type,
                      nproc_per_node=m.nproc_per_node, forkserver=int(C.FORKSERVER_RUNTIME.value) if m.warm else 0)


def table_terms(m: MemoryInput) -> list[Term]:
    """Every table's terms: weights, states, gradient rows and step temporaries."""
    return _tables(m) + _table_steps(m)


def _states(e: MemoryEstimate, per_table: bool) -> list[Term]:
    skip = ("tables", "table_states") if per_table else ()
    return [Term(k, where, getattr(b, k), source=STATE_TERMS[k])
            for where, b in (("device", e.device), ("host", e.host)) for k in STATE_TERMS if k not in skip]


def _tables(m: MemoryInput) -> list[Term]:
    """Each table outside the parts with its optimizer's states (fp32): whole on this rank (replicated), or in
    parameter-server mode its block of ceil(rows / shards) rows (the first ranks' share, the largest), so that a
    host holds its ranks' blocks and the job one copy."""
    if not m.per_table:
        return []
    out = []
    for t in m.tables:
        if not t.outside:
            continue
        rows = rows_per_rank(t)
        size = rows * t.dim * 4
        spec = TABLE_OPTIMIZERS.get(t.optimizer)
        per = (f"{spec.state_floats} per value" + (f" + {spec.row_floats} per row" if spec.row_floats else "")
               if spec is not None else "0 per value")
        whole = f"{t.rows:,} × {t.dim} fp32"
        share = f"ps: 1/{t.shards} of {whole} ({rows:,} rows per rank)" if t.sharded else whole
        of = f" of its {rows:,} rows (ps)" if t.sharded else ""
        out += [Term(f"{t.name} table", t.location, size, source=share),
                Term(f"{t.name} states", t.location, table_state_bytes(t.optimizer, rows, t.dim),
                     source=f"{t.optimizer}: {per}{of}")]
    return out


def _built_whole(m: MemoryInput) -> list[Term]:
    """Sharded tables while the model is built: the recipe builds each table whole, the rank copies its block out and
    frees the whole (launcher/worker/train.py build_model; a host's ranks take turns). Then the rank holds the whole
    tables and its blocks, but not yet its blocks' optimizer states nor the first step's kernels, which the
    ``always`` terms count: the build phase is what the whole tables add beyond those."""
    ps = [t for t in m.tables if t.sharded and t.built == "whole" and t.outside] if m.per_table else []
    if not ps:
        return []
    whole = sum(t.rows * t.dim * 4 for t in ps)
    states = sum(table_state_bytes(t.optimizer, rows_per_rank(t), t.dim) for t in ps)
    extra = whole - states - int(C.KERNELS_RUNTIME.value)
    return [Term("whole tables while built", "host", extra, phase="build", basis="estimate",
                 source=f"{', '.join(t.name for t in ps)} built whole ({whole / 2**20:,.1f} MiB) before each rank "
                        f"keeps its block; less their blocks' states and the step kernels, not there yet")]


def _runtime(m: MemoryInput) -> list[Term]:
    runtime = C.WARM_RANK_RUNTIME if m.warm else C.RANK_RUNTIME
    out = [Term("runtime", "host", int(runtime.value), basis="constant", source=runtime.source),
           Term("kernels", "host", int(C.KERNELS_RUNTIME.value), basis="constant", source=C.KERNELS_RUNTIME.source)]
    if "conv" in m.families and m.device_type == "cpu":
        out.append(Term("conv kernels", "host", int(C.CONV_KERNELS.value), basis="constant",
                        source=C.CONV_KERNELS.source))
    if m.imports[0] > 0:
        out.append(Term("your code's imports", "host", m.imports[0], basis="measured",
                        source=f"what importing {m.imports[1]} added to the launcher's RSS in preflight"))
    if m.deepspeed:
        out.append(Term("deepspeed runtime", "host", int(C.DEEPSPEED_RUNTIME.value), basis="constant",
                        source=C.DEEPSPEED_RUNTIME.source))
    if m.device_type == "cuda":
        out += [Term("cuda libraries", "host", int(C.CUDA_HOST_RUNTIME.value), basis="constant",
                     source=C.CUDA_HOST_RUNTIME.source),
                Term("cuda context", "device", int(C.CUDA_CONTEXT.value), basis="constant", source=C.CUDA_CONTEXT.source)]
    return out


def _activations(m: MemoryInput) -> list[Term]:
    if m.activation_bytes is None:
        return []
    flight = f" × {m.in_flight} micro-batches in flight" if m.in_flight > 1 else ""
    return [Term("activations", "device", m.activation_bytes * m.in_flight, phase="backward", basis="traced",
                 source=f"bytes kept for the backward of one micro-batch of {m.micro_size}{flight} (meta-device trace)")]


def _table_steps(m: MemoryInput) -> list[Term]:
    """The looked-up rows' gradients (kept from each backward to the step: grad_accum micro-batches of them, on the
    compute device, then concatenated and coalesced) and the temporaries of each table optimizer's step where the
    table lives. Unique rows are taken as every looked-up row (an upper bound: repeated ids coalesce).

    A ps table's owner steps the gradient rows the group sends it, as many on average as a rank looks up (each of n
    ranks sends 1/n of its rows to each owner), so the step's terms stay per lookup; the owner also holds the rows it
    received beside the ones it sent, one more gradient-rows-sized buffer on the host (``exchange``)."""
    out = []
    for t in m.tables:
        if not t.outside:
            continue
        rows = m.micro_size * m.grad_accum * m.lookups.get(t.name, 1.0)
        grad = int(rows * (t.dim * 4 + 8))  # fp32 values and an int64 row id each
        kept = f"{rows:,.0f} looked-up rows × {t.dim} floats"
        for phase in ("backward", "step"):
            out.append(Term(f"{t.name} gradient rows", "device", grad, phase=phase, basis="estimate",
                            source=f"{kept}, kept from the backward to the step"))
        if t.sharded:
            out.append(Term(f"{t.name} exchange", "host", grad, phase="step", basis="estimate",
                            source=f"the gradient rows the owner receives from the {t.shards} ranks of its group "
                                   f"(all-to-all; about {rows:,.0f} rows on average: range blocks balance rows, not "
                                   f"lookups)"))
        temps = TABLE_STEP_TEMPS.get(t.optimizer, 2)
        step = 2 * grad + temps * int(rows * t.dim * 4)
        out.append(Term(f"{t.name} step", t.location, step, phase="step", basis="estimate",
                        source=f"coalesce (2 × the gradient rows) and {temps} row-sized temporaries of its "
                               f"{t.optimizer} step ({kept})"))
        if m.prefetch and t.on_host and not t.sharded:
            out += _prefetch_terms(m, t, rows)
        if (m.device_type == "cpu" or t.on_host) and grad < C.MMAP_MAX:
            out.append(Term(f"{t.name} heap slack", "host", step, basis="estimate",
                            source=f"glibc keeps the freed step temporaries of {t.name} in its heap (each under "
                                   f"{C.MMAP_MAX >> 20} MiB, glibc's largest mmap threshold); wide_deep grew 19 MB "
                                   f"over 300 steps here"))
    return out


def _prefetch_terms(m: MemoryInput, t, rows: float) -> list[Term]:
    """placement.prefetch: the queued micro-batches' rows (and the one running), each looked-up row counted (an
    upper bound: they are gathered once per unique id) with its position and its recorded id; and a step's row
    updates, kept past the step until the prefetch thread has written those the next micro-batches do not need."""
    per_micro = rows / m.grad_accum
    queued = int((m.prefetch + 1) * per_micro * (t.dim * 4 + 16))
    return [Term(f"{t.name} prefetch", "device", queued, basis="estimate",
                 source=f"{m.prefetch + 1} micro-batches × {per_micro:,.0f} rows × {t.dim} floats gathered ahead, "
                        f"with their positions and recorded ids (launcher/tables/prefetch.py)"),
            Term(f"{t.name} deferred writes", t.location, int(rows * t.dim * 4 * 3), phase="backward",
                 basis="estimate", source="a step's new rows (weight and up to two states) kept until the prefetch "
                                          "thread writes them, during the next forward and backward")]


def _dense_step(m: MemoryInput) -> list[Term]:
    """One fp32 temporary the size of the parameters the optimizer steps (its states are state_floats of them)."""
    floats = DENSE_OPTIMIZERS[m.optimizer].state_floats if m.optimizer in DENSE_OPTIMIZERS else 0
    states = m.estimate.device.optimizer + m.estimate.host.optimizer
    if not floats or not states:
        return []
    return [Term("optimizer step", m.optimizer_location, int(DENSE_STEP_TEMPS * states / floats), phase="step",
                 basis="estimate", source="a parameter-sized fp32 temporary of the foreach step (torch's "
                                          "_multi_tensor_adam: the sqrt of exp_avg_sq)")]
