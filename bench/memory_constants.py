"""The runtime constants a memory model needs, measured on this machine: each the median of N fresh processes, the
probes interleaved (one of each, then again), with their spread.

    .venv/bin/python bench/memory_constants.py [--repeats 5] [--steps 20] [--json OUT]

Python probes (each a fresh interpreter that reads its own /proc/self/status at the end; not ru_maxrss, which Linux
carries over from the parent across vfork + exec): `python -c pass`; `import torch`; `import torch` + a gloo
process group of world 1; the same + `import deepspeed` (DS_ACCELERATOR=cpu). Launches (`hetero-launch`, 2 CPU
ranks): the launcher's own VmRSS (median of its samples every 50 ms while it has children) and VmHWM during
`recipe=quickstart trainer.steps=--steps`; and a rank's memory.json "peak" (rank 0: rss_at_start, rss_after_build,
rss) for `recipe=wide_deep` on torch DDP and on DeepSpeed (`zero.stage=1`). Not a test: the figures belong to the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 2**20
REPORT = (
          "s = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
          "print(int(s['VmRSS'].split()[0]) * 1024, int(s['VmHWM'].split()[0]) * 1024)\n")
GLOO = ("import socket, torch.distributed as dist\n"
        "with socket.socket() as s:\n"
        "    s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]\n"
        "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)\n")
PROBES = {
    "python -c pass": "",
    "import torch": "import torch\n",
    "torch + gloo world 1": "import torch\n" + GLOO,
    "torch + gloo + deepspeed": "import torch\n" + GLOO + "import deepspeed\n",
    "torch + a first forward, backward and Adam step": (
        "import torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(100, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))\n"
        "e = torch.nn.Embedding(1000, 16)\n"
        "opt = torch.optim.Adam([*m.parameters(), *e.parameters()])\n"
        "(m(torch.randn(32, 100)).sum() + e(torch.randint(0, 1000, (32,))).sum()).backward()\n"
        "opt.step()\n"),
    "torch + resnet's first step (conv; compare with the MLP's above)": (
        "import torch\n"
        "from hydra.utils import instantiate\n"
        "from omegaconf import OmegaConf\n"
        "from launcher.config import compose_config\n"
        "from launcher.recipes import RECIPES\n"
        "cfg = compose_config(['recipe=resnet'])\n"
        "r = RECIPES['resnet']\n"
        "m = instantiate(r.model_spec(OmegaConf.to_object(cfg.model), r.data_facts(OmegaConf.to_object(cfg.data))))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)\n"
        "m(torch.randn(8, 3, 32, 32)).sum().backward()\n"
        "opt.step()\n"),
}
"""Name -> the code run before REPORT in a fresh interpreter."""


def probe(code: str) -> dict[str, int]:
    """{"rss", "hwm"} in bytes of a fresh interpreter that ran code."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = subprocess.run([sys.executable, "-c", code + REPORT], env=env, capture_output=True, text=True, check=True)
    rss, hwm = out.stdout.split()[-2:]
    return {"rss": int(rss), "hwm": int(hwm)}


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of pid in bytes ({} once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = (line.split(":", 1) for line in f)
            return {k: int(v.split()[0]) * 1024 for k, v in fields if k in ("VmRSS", "VmHWM")}
    except (OSError, ValueError):
        return {}


def _has_children(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return bool(f.read().split())
    except OSError:
        return False


def launch(overrides: list[str], cwd: Path) -> tuple[dict[str, int], Path]:
    """Run hetero-launch with overrides in cwd, sampling the launcher every 50 ms: ({"rss": median VmRSS while it had
    children, "hwm": its last VmHWM}, the run dir)."""
    script = Path(sys.executable).with_name("hetero-launch")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "launcher.cli"]
    log_dir = Path(tempfile.mkdtemp(dir=cwd))
    proc = subprocess.Popen([*cmd, *overrides, f"output.log_dir={log_dir}"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
    rss, hwm = [], 0
    while proc.poll() is None:
        st = _status(proc.pid)
        hwm = max(hwm, st.get("VmHWM", 0))
        if st and _has_children(proc.pid):
            rss.append(st["VmRSS"])
        time.sleep(0.05)
    out = proc.stdout.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"hetero-launch {' '.join(overrides)} failed:\n{out[-3000:]}")
    run = next(p for p in log_dir.iterdir() if p.is_dir() and not p.is_symlink())
    return {"rss": int(statistics.median(rss)) if rss else 0, "hwm": hwm}, run


def rank_peak(run: Path, rank: int = 0) -> dict[str, int]:
    peak = json.loads((run / f"rank.{rank}" / "memory.json").read_text())["peak"]
    return {k: peak[k] for k in ("rss_at_start", "rss_after_build", "rss")}


def measure(repeats: int, steps: int) -> dict[str, list[int]]:
    """Every figure's samples in bytes, the probes interleaved."""
    samples: dict[str, list[int]] = {}

    def add(name: str, value: int) -> None:
        samples.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for i in range(repeats):
            for name, code in PROBES.items():
                add(f"{name}: VmRSS", probe(code)["rss"])
            launcher, _ = launch(["recipe=quickstart", f"trainer.steps={steps}"], cwd)
            add(f"launcher (quickstart {steps} steps): VmRSS", launcher["rss"])
            add(f"launcher (quickstart {steps} steps): VmHWM", launcher["hwm"])
            for label, extra in (("ddp", []), ("zero.stage=1", ["zero.stage=1"])):
                _, run = launch(["recipe=wide_deep", "trainer.steps=5", *extra], cwd)
                for key, value in rank_peak(run).items():
                    add(f"wide_deep {label} rank 0: {key}", value)
            print(f"round {i + 1}/{repeats} done", file=sys.stderr, flush=True)
    return samples


def table(samples: dict[str, list[int]]) -> str:
    rows = [f"{'figure':<46} {'median MiB':>10} {'min':>8} {'max':>8} {'spread':>7}"]
    for name, values in samples.items():
        med = statistics.median(values)
        spread = (max(values) - min(values)) / med if med else 0.0
        rows.append(f"{name:<46} {med / MIB:>10.1f} {min(values) / MIB:>8.1f} {max(values) / MIB:>8.1f} "
                    f"{spread:>6.1%}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="fresh processes per figure")
    ap.add_argument("--steps", type=int, default=20, help="quickstart's steps while the launcher is sampled")
    ap.add_argument("--json", help="also write the samples (bytes) here")
    args = ap.parse_args()
    samples = measure(args.repeats, args.steps)
    print(f"{args.repeats} fresh processes each, interleaved; spread = (max - min) / median; "
          f"{os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(table(samples))
    if args.json:
        Path(args.json).write_text(json.dumps(samples, indent=2) + "\n")


if __name__ == "__main__":
    main()
