"""Print N numbered lines to stdout and N to stderr at the same time (two threads), flush, say so, then wait to be
killed: the launcher's log files must keep every line whole and in order."""

import os
import sys
import threading
import time
from pathlib import Path

n, done_dir = int(sys.argv[1]), Path(sys.argv[2])
rank = os.environ["RANK"]


def write(stream, name):
    for i in range(n):
        stream.write(f"rank {rank} {name} line {i:07d} " + "x" * (i % 50) + "\n")
    stream.flush()


threads = [threading.Thread(target=write, args=(s, name)) for s, name in ((sys.stdout, "out"), (sys.stderr, "err"))]
for t in threads:
    t.start()
for t in threads:
    t.join()
(done_dir / f"rank{rank}.done").write_text(str(os.getpid()))
time.sleep(600)
