"""One rank: ``python -m launcher.worker <run_dir>``, started by the launcher with the rank's env from plan.json."""

import sys
import traceback

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
    try:
        main()
    except Exception:  # recorded in error.json by @record; printed here, as the interpreter would
        traceback.print_exc()
        # Without the interpreter's teardown: it destroys gloo's threads while a peer may still be talking to this
        # rank ("terminate called without an active exception"), and the rank would die of SIGABRT instead of
        # ending with its error's exit code (a blame that names a crash, not the error).
        fast_exit(1)
    fast_exit(0)  # the rank's work is done and its files are closed: skip the interpreter's teardown
