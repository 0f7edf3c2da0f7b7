"""The host-table kernels of a git revision against the working tree's, in one process: ``store.step()`` (the
coalesce of a step's gradients and the update of its rows) of tbe_bench's project variants, the two builds of
launcher/tables/kernels.c swapped step by step, so that a virtual machine's slow spells fall on both.

    .venv/bin/python bench/kernels_ab.py [--rev HEAD] [--shape 26x1000000x16] [--batch 4096] [--threads 1]
                                         [--variants sgd,rowwise_adagrad] [--rounds 5] [--steps 20]

Both sources are built as the ranks build theirs (kernels.py ``library``, cached by content) and loaded side by side;
the Python around them is the working tree's. Each round times --steps steps of each build (the forward, backward
and collect before each untimed, as ``tbe_bench --kernels``), the first round untimed; reported per variant: each
build's median ms over the rounds' medians and the rounds' ratios rev / working tree (above 1: the working tree is
faster), as ``tbe_bench --kernels`` reports its thread counts (``alternating``, ``speed_up``). The process's malloc
is set as a recipe rank's (launcher/worker/heap.py). Appends to bench/results/kernels_before_after.txt. Not a test:
numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tbe_bench  # noqa: E402  (bench/ is not a package)

from launcher.tables import kernels  # noqa: E402
from rank_malloc import as_a_rank  # noqa: E402


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
    timed = functools.partial(tbe_bench.store_step, step, store, data, grad)
    settings = {name: functools.partial(setattr, kernels, "_lib", lib) for name, lib in libs.items()}
    return tbe_bench.speed_up(variant, tbe_bench.alternating(timed, settings, rounds, steps))


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
    print(as_a_rank(), flush=True)  # the process's malloc as a recipe rank's
    torch.set_num_threads(args.threads)
    shape = tuple(int(x) for x in args.shape.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        libs = {args.rev: kernels.library(at_revision(args.rev, Path(tmp))), "tree": kernels.library()}
    lines = [f"# kernels_ab {args.rev} against the working tree, {args.shape} batch {args.batch}, {args.threads} "
             f"thread(s), {args.rounds} rounds x {args.steps} steps each, alternating step by step: store.step(); "
             f"{tbe_bench.machine()}",
             f"{'variant':<24}{args.rev[:11] + ' ms':>12}{'tree ms':>14}   {args.rev[:11]} / tree (rounds)"]
    lines += [compare(v, shape, args.batch, libs, args.rounds, args.steps)
              for v in tbe_bench.fitting(args.variants.split(","), shape)]
    tbe_bench.report("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
