"""Live progress from rank 0's records: a rich bar on a terminal, one plain line per logged step elsewhere (CI)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from launcher.report.summary import odd_record
from launcher.rundir import RankDir, json_lines


class ProgressView:
    def __init__(self, console: Console, rank_dir: RankDir, total_steps: int) -> None:
        self._console = console
        self._metrics = rank_dir.metrics
        self._rank_dir = rank_dir
        self._offset = 0
        self._total = total_steps
        self._live = console.is_terminal
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} samples/s"),
            TimeElapsedColumn(),
            console=console,
            disable=not self._live,
        )
        self._task = self._progress.add_task("train", total=total_steps or None, loss="-", rate="-")  # a script: 0

    def __enter__(self) -> ProgressView:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.tick()
        self._progress.stop()

    def tick(self) -> None:
        for record in self._new_records():
            if "event" in record:
                if not self._live:
                    shown = ("loss", "auc", "bayes_auc", "logloss", "accuracy", "n")
                    fields = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in record.items() if k in shown)
                    self._console.print(f"{record['event']} at step {record['step']}" + (f": {fields}" if fields else "")
                                        + _early_stop_words(record))
                continue
            loss, rate = record.get("loss"), record.get("samples_per_s")  # a script's runtime.log may give neither
            self._progress.update(self._task, loss="-" if loss is None else f"{loss:.4f}",
                                  rate="-" if rate is None else f"{rate:.0f}")
            if not self._live:
                total = f"/{self._total}" if self._total else ""
                self._console.print(f"step {record['step']}{total}" + ("" if loss is None else f"  loss {loss:.5f}")
                                    + ("" if rate is None else f"  {rate:.0f} samples/s"))
        self._progress.update(self._task, completed=self._rank_dir.last_step())

    def _new_records(self) -> list[dict]:
        try:
            with open(self._metrics) as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind("\n") + 1]  # leave a half-written last line for the next tick
        self._offset += len(complete)
        # the summary names what was skipped; the bar just goes on
        return [record for record in json_lines(complete) if not odd_record(record)]


def _early_stop_words(record: dict) -> str:
    """What an ``early_stop`` record says, in words ('' for any other record)."""
    if record.get("event") != "early_stop" or not isinstance(record.get("best"), (int, float)):
        return ""
    how = (f"{record.get('validations_without_improvement')} validations without improvement"
           if record.get("stopped") else "the last step reached")
    return f": {how}; the best, {record['best']:.4f} at step {record.get('best_step')}, is checkpoints/best"
