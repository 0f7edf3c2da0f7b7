"""The constants of the memory model and the step-time model, each with where it comes from.

A memory term the plan cannot count from the model (the runtime's own bytes, a CUDA context) is one of these; so are
the bandwidths and throughputs the step-time model divides by. "measured" ones were measured on the CI machine
(2 cores, no GPU: ``bench/memory_constants.py``, ``bench/cost_constants.py``) and are what a CPU run is checked
against; the GPU ones are from vendors' data sheets and have never been measured by this project (docs/gpu.md)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30
MMAP_MAX = 32 * MIB
"""glibc's dynamic mmap threshold rises to at most this: a block below it, once freed, stays in the heap for reuse
(the heap does not shrink); one of this size or more is mapped afresh when made (each use faults all its pages in)
and unmapped when freed."""


@dataclass(frozen=True)
class Constant:
    value: float
    source: str


# -- memory -----------------------------------------------------------------------------------------------------------
RANK_RUNTIME = Constant(235 * MIB, "a CPU rank's RSS at start: python, torch, the gloo process group, hydra and the "
                                   "worker imported (rss_at_start, bench/memory_constants.py: 234.8 MiB, median of 5)")
WARM_RANK_RUNTIME = Constant(197 * MIB, "a CPU rank forked from the warm-start forkserver (launcher.warm_start): "
                                        "the fresh rank's RSS less what it inherits unfaulted (measured peaks of "
                                        "wide_deep, gpt, my_ctr and resnet ranks 35-50 MiB below a fresh rank's: "
                                        "tests/integration/test_memory_prediction.py)")
FORKSERVER_RUNTIME = Constant(25 * MIB, "what the warm-start forkserver adds to its host beyond its ranks' RSS: its "
                                        "private memory (smaps_rollup during a wide_deep run: Private 25 MB of its 299 "
                                        "MB RSS; the rest is shared with the ranks forked from it, whose RSS counts "
                                        "it; launcher/backends/warm_start.py)")
KERNELS_RUNTIME = Constant(83 * MIB, "what a rank's first forward, backward and optimizer step add to its RSS: "
                                     "torch's CPU kernels (oneDNN, MKL) and autograd's engine loaded "
                                     "(bench/memory_constants.py: 218 -> 302 MiB)")
CONV_KERNELS = Constant(50 * MIB, "what a convolutional model's first step adds beyond an MLP's: oneDNN's convolution "
                                   "primitives (resnet's first step +137 MB vs +87 MB, bench/memory_constants.py)")
DEEPSPEED_RUNTIME = Constant(70 * MIB, "what deepspeed's import and engine add to a rank's RSS (rss_after_build of "
                                       "wide_deep at zero.stage=1 less DDP's: 436.7 - 366.3 MiB, "
                                       "bench/memory_constants.py)")
LAUNCHER_RUNTIME = Constant(234 * MIB, "the launcher's own RSS while its ranks run (VmHWM during a quickstart run: "
                                       "233.9 MiB, bench/memory_constants.py)")
CUDA_HOST_RUNTIME = Constant(1.0 * GIB, "host RSS a rank's CUDA libraries add (cuBLAS, cuDNN, NCCL mapped; "
                                        "PyTorch forum figures, never measured here)")
CUDA_CONTEXT = Constant(0.5 * GIB, "device memory of a CUDA context outside torch's allocator (H100, CUDA 12: "
                                   "~500 MiB, NVIDIA forum figures; never measured here)")

# -- step time --------------------------------------------------------------------------------------------------------
CPU_FLOPS = Constant(20e9, "fp32 matmul throughput of one CPU rank of 1 core (bench/cost_constants.py measures it)")
CPU_MEMORY_BW = Constant(5e9, "bytes/s one CPU rank streams through an elementwise optimizer step")
GPU_FLOPS = Constant(400e12, "H100 SXM dense bf16 at ~40 % of its 989 TFLOP/s peak (data sheet; not measured)")
GPU_MEMORY_BW = Constant(2.0e12, "H100 HBM3 at ~60 % of 3.35 TB/s (data sheet; not measured)")
PCIE_BW = Constant(25e9, "host<->device bytes/s over PCIe Gen5 x16 at ~40 % of 64 GB/s (pinned; not measured)")
HOST_MEMORY_BW = Constant(10e9, "bytes/s a host-side optimizer step (CPU Adam) streams per rank")
NETWORK_BW = Constant(12.5e9, "bytes/s of one rank's share of the data-parallel all-reduce (100 Gb/s; not measured)")
DEEPSPEED_STEP = Constant(0.55e-3, "what DeepSpeed's engine adds to a step over torch DDP: quickstart, 2 CPU ranks, "
                                   "2.00 vs 1.45 ms (bench/suite.py P4, docs/performance.md)")
FSDP_STEP = Constant(0.3e-3, "what FSDP2's per-unit hooks add to a step of a small model on CPU (bench/zero_bench.py "
                             "order of magnitude; not a fit)")
LOCAL_BW = Constant(2e9, "bytes/s of gloo's all-reduce between ranks of one CPU host (shared memory, measured order)")
