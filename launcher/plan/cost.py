"""The step-time model (pure): seconds of one optimizer step of a layout, to rank the layouts that fit.

Compute is 6 flops per parameter and sample (forward 2, backward 4), plus 2 more per recomputed parameter; the dense
optimizer streams its states where it lives; offload moves gradients down and parameters up over PCIe (and ZeRO-3
parameter offload fetches the parameters for the forward and the backward); data parallelism all-reduces the
gradients (ZeRO-3: 1.5 times, for its gathers); a table's step moves the looked-up rows (and their gradients) between
host and device when it lives on the host of a GPU, and streams its rows and states; a ps table's rows and their
gradients also go to and from their owners over the network. The constants are
launcher/constants.py's; on a CPU host there is no PCIe. It ranks layouts; it is not a promise of seconds."""

from __future__ import annotations

from dataclasses import dataclass

from launcher import constants as C


@dataclass(frozen=True)
class CostInput:
    device_type: str
    dense_params: int
    """Parameters one rank computes with (after tensor parallel and the pipeline)."""
    dp: int
    nnodes: int
    samples: int
    """Samples per rank and step (micro × grad_accum)."""
    state_floats: int
    """fp32 values per parameter of the dense optimizer's states."""
    tables: tuple[tuple[str, int, float, int], ...] = ()
    """(name, dim, rows looked up per sample, state floats) of each table outside the parts."""
    group: int = 1
    """Ranks a ps table's rows are split over (world size / pipeline stages)."""


def step_time(c: CostInput, zero: int, offload_optimizer: bool, offload_params: bool, recompute: bool,
              host_tables: tuple[str, ...], ps_tables: tuple[str, ...] = (),
              hosted: tuple[tuple[int, int], ...] = ()) -> float:
    """Estimated seconds of one step. ``host_tables``: the tables in host memory, ``ps_tables`` among them those
    split over the ranks, whose rows and gradients cross the network to and from their owners ((n - 1) / n of them).
    ``hosted``: (parameters, input + output floats per sample) of each dense module on the host (placement.modules;
    ``c.dense_params`` is then what the device computes): its forward and backward on the host's cores, its optimizer
    there, its activations and their gradients across PCIe, its gradients' all-reduce."""
    gpu = c.device_type == "cuda"
    flops = C.GPU_FLOPS.value if gpu else C.CPU_FLOPS.value
    device_bw = C.GPU_MEMORY_BW.value if gpu else C.CPU_MEMORY_BW.value
    host_bw = C.HOST_MEMORY_BW.value if gpu else C.CPU_MEMORY_BW.value
    pcie = C.PCIE_BW.value if gpu else float("inf")
    shard = c.dp if zero >= 1 else 1
    seconds = (6 + (2 if recompute else 0)) * c.dense_params * c.samples / flops
    states = c.dense_params * 4 * (2 + c.state_floats) / shard  # read and write the weights, read-modify the states
    seconds += states / (host_bw if offload_optimizer else device_bw)
    if offload_optimizer:
        seconds += 2 * c.dense_params * 4 / shard / pcie
    if offload_params:
        seconds += 2 * c.dense_params * 4 / pcie
    net = C.NETWORK_BW.value if c.nnodes > 1 else C.LOCAL_BW.value
    if c.dp > 1:
        seconds += (1.5 if zero >= 3 else 1.0) * 2 * (c.dp - 1) / c.dp * c.dense_params * 4 / net
    host, ps = set(host_tables), set(ps_tables)
    for name, dim, per_sample, floats in c.tables:
        rows = c.samples * per_sample * dim * 4
        on_host = name in host
        seconds += rows * (2 + 2 * floats) / (host_bw if on_host else device_bw)
        if on_host:
            seconds += 2 * rows / pcie
        if name in ps and c.group > 1:
            seconds += 2 * rows * (c.group - 1) / c.group / net
    for params, io in hosted:
        seconds += 6 * params * c.samples / C.CPU_FLOPS.value + params * 4 * (2 + c.state_floats) / host_bw
        seconds += 2 * c.samples * io * 4 / pcie
        if c.dp > 1:
            seconds += 2 * (c.dp - 1) / c.dp * params * 4 / net
    return seconds
