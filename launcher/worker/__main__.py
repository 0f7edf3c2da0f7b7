"""One rank: ``python -m launcher.worker <run_dir>``, started by the launcher with the rank's env from plan.json."""

import sys

from torch.distributed.elastic.multiprocessing.errors import record

from launcher.fastexit import fast_exit
from launcher.rundir import register_stack_dump
from launcher.worker.train import run_rank


@record  # writes the traceback to rank.N/error.json for the launcher's failure report
def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m launcher.worker <run_dir>")
    register_stack_dump()
    run_rank(sys.argv[1])


if __name__ == "__main__":
    main()
    fast_exit(0)  # the rank's work is done and its files are closed: skip the interpreter's teardown
