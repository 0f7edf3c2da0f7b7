"""The host-table kernels of a git revision against the working tree's, in one process: ``store.step()`` (the
coalesce of a step's gradients and the update of its rows) of tbe_bench's project variants, the two builds of
launcher/tables/kernels.c swapped step by step, so that a virtual machine's slow spells fall on both.

    .venv/bin/python bench/kernels_ab.py [--rev HEAD] [--shape 26x1000000x16] [--batch 4096] [--threads 1]
                                         [--variants sgd,rowwise_adagrad] [--rounds 5] [--steps 20]

Both sources are built as the ranks build theirs (launcher/native.py, cached by content) and loaded side by side;
the Python around them is the working tree's. Each round times --steps steps of each build (the forward, backward
and collect before each untimed, as ``tbe_bench --kernels``), the first round untimed; reported per variant: each
build's median ms over the rounds' medians and the rounds' ratios rev / working tree (above 1: the working tree is
faster). The process's malloc is set as a recipe rank's (launcher/worker/heap.py). Appends to bench/results/kernels_before_after.txt. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tbe_bench  # noqa: E402  (bench/ is not a package)

from launcher import native  # noqa: E402
from launcher.tables import kernels  # noqa: E402
from launcher.worker.heap import keep_freed_memory  # noqa: E402


def load(source: Path) -> ctypes.CDLL:
    """kernels.c at ``source``, built and loaded with kernels.py's signatures."""
    lib = ctypes.CDLL(str(native.build(source)))
    for name, args in kernels.SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, kernels.I64
    return lib


def at_revision(rev: str, folder: Path) -> Path:
    text = subprocess.run(["git", "-C", str(tbe_bench.ROOT), "show", f"{rev}:launcher/tables/kernels.c"],
                          capture_output=True, text=True, check=True).stdout
    path = folder / "kernels.c"
    path.write_text(text)
    return path


def compare(variant: str, shape: tuple[int, int, int], batch: int, libs: dict[str, ctypes.CDLL], rounds: int,
            steps: int) -> str:
    tables, rows, dim = shape
    step, store = tbe_bench.build(variant, tables, rows, dim)
    data = itertools.cycle(tbe_bench.batches(tables, rows, batch, 2 * steps + 1, seed=1))
    grad = torch.randn(batch, tables * dim, generator=torch.Generator().manual_seed(2))
    names = list(libs)
    per: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds + 1):
        times: dict[str, list[float]] = {n: [] for n in names}
        for i in range(2 * steps):
            which = names[(i + r) % 2]
            kernels._lib = libs[which]
            times[which].append(tbe_bench.store_step(step, store, data, grad))
        if r:
            for n in names:
                per[n].append(statistics.median(times[n]) * 1e3)
    ratios = [a / b for a, b in zip(per[names[0]], per[names[1]])]
    return (f"{variant:<18}{statistics.median(per[names[0]]):>10.2f}{statistics.median(per[names[1]]):>10.2f}   "
            f"{statistics.median(ratios):.3f}x ({', '.join(f'{x:.3f}' for x in ratios)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--shape", default="26x1000000x16", help="TABLESxROWSxDIM")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="sgd,rowwise_adagrad")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "kernels_before_after.txt"))
    args = ap.parse_args()
    if not kernels.available():
        raise SystemExit(f"the table kernels do not load here: {kernels.why_not()}")
    print(keep_freed_memory(), flush=True)  # the process's malloc as a recipe rank's
    torch.set_num_threads(args.threads)
    shape = tuple(int(x) for x in args.shape.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        libs = {args.rev: load(at_revision(args.rev, Path(tmp))), "tree": load(kernels.SOURCE)}
    lines = [f"# kernels_ab {args.rev} against the working tree, {args.shape} batch {args.batch}, {args.threads} "
             f"thread(s), {args.rounds} rounds x {args.steps} steps each, alternating step by step: store.step(); "
             f"{tbe_bench.machine()}",
             f"{'variant':<18}{args.rev[:9]:>10}{'tree':>10}   {args.rev[:9]} / tree (rounds)"]
    lines += [compare(v, shape, args.batch, libs, args.rounds, args.steps)
              for v in tbe_bench.fitting(args.variants.split(","), shape)]
    tbe_bench.report("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
