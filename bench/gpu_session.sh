#!/usr/bin/env bash
# The one prepared script for a session lent a GPU (the device tool; ~6 minutes of its 15): the gpu-marked tests,
# then bench/gpu_bench.py (issue 32: host tables vs device tables, with and without placement.prefetch), results
# under bench/results/ (and $OUT when the device tool runs it). Run from the repository root:
#   ./run.sh test --co -q >/dev/null && bash bench/gpu_session.sh
# The venv needs a CUDA torch: HL_TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126'.
set -uo pipefail
out="${OUT:-bench/results}"
mkdir -p "$out" bench/results
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu_session.txt"
timeout 180 .venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_gpu.py 2>&1 | tail -15 \
  | tee -a "$out/gpu_session.txt"
timeout 200 .venv/bin/python bench/gpu_bench.py --rounds 2 --steps 30 2>&1 | tail -30 | tee -a "$out/gpu_session.txt"
cp "$out/gpu_session.txt" bench/results/ 2>/dev/null || true
