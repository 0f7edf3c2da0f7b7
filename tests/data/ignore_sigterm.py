"""A rank that ignores SIGTERM (as a process stuck in cleanup can): only SIGKILL stops it."""

import os
import signal
import sys
import time
from pathlib import Path

signal.signal(signal.SIGTERM, signal.SIG_IGN)
(Path(sys.argv[1]) / f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(600)
