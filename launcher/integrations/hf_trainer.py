"""HF Trainer's metrics in the run's records without user code, through the one callback transformers registers from
the environment alone (SIDE EFFECTS: a loopback HTTP listener in the launcher, the run's metrics files).

transformers 5.x (``transformers/integrations/integration_utils.py``): ``TrainingArguments.__post_init__`` adds
``"kubeflow"`` to ``report_to`` when ``is_kubeflow_available()``, i.e. when ``KUBEFLOW_TRAINER_SERVER_URL`` is set (and
``DISABLE_KUBEFLOW_INTEGRATION`` is not true); Trainer then builds ``KubeflowCallback`` from ``INTEGRATION_TO_CALLBACK``
as it builds any report_to callback. On rank 0 the callback POSTs ``{"trainerStatus": {"progressPercentage",
"estimatedRemainingSeconds", "metrics": [{"name", "value"}, ...]}}`` with ``Authorization: Bearer <the token in the
file KUBEFLOW_TRAINER_SERVER_TOKEN names>``: at the start (total_steps), after a step at most every 5 s (the last
logged loss, learning_rate, grad_norm, epoch, current_step, total_steps) and at the end (the last values and the
Trainer's train_runtime, train_samples_per_second, train_loss). hetero-launch plays the controller: it listens on
127.0.0.1, checks the token, and writes each status with a step as a metrics.jsonl record of every rank (the
Trainer's loss is already the mean over the ranks) and to rank 0's loggers. The curve is as fine as the callback
sends it: one point per 5 s of training, and the last step."""

from __future__ import annotations

import json
import secrets
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from launcher.rundir import RunDir

KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "epoch": "epoch",
        "train_samples_per_second": "samples_per_s", "train_steps_per_second": "steps_per_s",
        "train_runtime": "train_runtime_s", "train_loss": "train_loss"}
"""The callback's metric names -> the record's (a recipe's names where there is one: lr, samples_per_s)."""


def record_of(status: dict[str, Any], total: int) -> dict[str, Any] | None:
    """A metrics.jsonl record of one POSTed trainerStatus (step: current_step, or total_steps when it reports 100 %);
    None when it names no step or no number."""
    metrics = {}
    for m in status.get("metrics") or ():
        try:
            metrics[str(m["name"])] = float(m["value"])
        except (KeyError, TypeError, ValueError):
            continue
    total = int(metrics.get("total_steps", total) or 0)
    step = metrics.get("current_step")
    if step is None and status.get("progressPercentage") == 100 and total:
        step = total
    record = {KEYS[k]: v for k, v in metrics.items() if k in KEYS}
    return None if step is None or not record else {"step": int(step), **record}


class TrainerFeed:
    """The listener. ``env``: what each rank gets; ``close()`` stops it and the loggers."""

    def __init__(self, run_dir: RunDir, ranks: list[int], loggers: tuple[dict[str, Any], ...]) -> None:
        from launcher.loggers import LOGGERS
        from launcher.loggers.sink import build_loggers

        self._run_dir, self._ranks, self._total, self._t0 = run_dir, ranks, 0, time.time()
        self._lock = threading.Lock()
        tensorboard = LOGGERS["tensorboard"]  # its default folder comes from a rank's HL_RUN_DIR: given here
        specs = [{**s, "log_dir": str(run_dir.tensorboard)} if s.get("_target_") == tensorboard
                 and not s.get("log_dir") else s for s in loggers]
        self._loggers = build_loggers(specs) if specs else None
        token = secrets.token_hex(16)
        token_file = run_dir.path / "trainer_feed.token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        feed = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                ok = self.headers.get("Authorization") == f"Bearer {token}"
                if ok:
                    try:
                        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                        feed.take(body.get("trainerStatus") or {})
                    except (ValueError, AttributeError):
                        ok = False
                self.send_response(200 if ok else 400)
                self.end_headers()

            def log_message(self, *args: Any) -> None:  # quiet: the records are the output
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="trainer-feed", daemon=True)
        self._thread.start()
        self.env = {"KUBEFLOW_TRAINER_SERVER_URL": f"http://127.0.0.1:{self._server.server_address[1]}/status",
                    "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token_file)}

    def take(self, status: dict[str, Any]) -> None:
        """One status: its record appended to every rank's metrics.jsonl (rank 0's loggers get it too)."""
        with self._lock:
            for m in status.get("metrics") or ():
                if isinstance(m, dict) and m.get("name") == "total_steps":
                    with suppress(TypeError, ValueError):
                        self._total = int(float(m["value"]))
            record = record_of(status, self._total)
            if record is None:
                return
            now = time.time()
            record |= {"time": round(now, 3), "wall_s": round(now - self._t0, 3)}
            line = json.dumps(record) + "\n"
            for rank in self._ranks:
                rank_dir = self._run_dir.rank(rank)
                rank_dir.path.mkdir(parents=True, exist_ok=True)
                with open(rank_dir.metrics, "a") as f:
                    f.write(line)
            if self._loggers is not None:
                from launcher.loggers.sink import metrics_of

                found = metrics_of(record)
                if found:
                    self._loggers.log_metrics(*found)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._loggers is not None:
            self._loggers.close()
