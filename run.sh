#!/usr/bin/env bash
# hetero-launch from a fresh clone: creates .venv when missing, installs torch only when none is importable there
# (CPU default torch==2.13.0; HL_TORCH_SPEC picks another, e.g. a CUDA build), installs this project, then
#   ./run.sh recipe=wide_deep [key=value ...]   runs hetero-launch in the current directory (log_output/ lands here)
#   ./run.sh test [pytest args]                 runs the test suite (two pytest-xdist workers; HL_TEST_WORKERS=0: one)
# HL_VENV=path: use another venv. HL_SYSTEM_SITE=1: let a new venv see the system's packages (keeps a torch you have).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${HL_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "run.sh: creating $VENV" >&2
  python3 -m venv ${HL_SYSTEM_SITE:+--system-site-packages} "$VENV"
fi
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  spec="${HL_TORCH_SPEC:-torch==2.13.0}"
  echo "run.sh: installing $spec" >&2
  # shellcheck disable=SC2086  # unquoted on purpose: the spec may carry pip options (--index-url ...)
  "$PY" -m pip install -q $spec
fi
# pyproject's floor (the oldest torch anything here ran on): refuse an older one rather than let pip replace it.
if ! "$PY" -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < (2, 11))"; then
  echo "run.sh: $("$PY" -c 'import torch; print(torch.__version__)') in $VENV is older than torch 2.11, the oldest hetero-launch was tested on." >&2
  echo "run.sh: upgrade it yourself (pip install 'torch>=2.11' with your CUDA index), or use another venv (HL_VENV=path)." >&2
  exit 2
fi
# Reinstall the project only when its metadata changed (the install is editable: code edits need none).
stamp="$VENV/.hetero-launch-installed"
want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "run.sh: installing hetero-launch and its dependencies into $VENV" >&2
  "$PY" -m pip install -q -e "$ROOT[test]"
  # TorchRec for its tests, without the fbgemm-gpu (CUDA, 500 MB) it declares: the test extra brings FBGEMM's CPU build
  # and its other dependencies. Best effort: where it does not install, its tests skip with the reason.
  "$PY" -m pip install -q --no-deps "torchrec==1.9.2" || echo "run.sh: torchrec not installed: its tests skip" >&2
  # torchvision and timm for the tests of their models' pipelines, the same way: --no-deps (torch stays as it is),
  # torchvision's build for this torch (2.x -> 0.(x+15): 2.13 -> 0.28), kept only where it imports: PyPI's wheel is
  # CUDA's, which beside a CPU torch cannot load its ops and fails `import torchvision` (transformers' too).
  if ! "$PY" -c "import torchvision, timm" 2>/dev/null; then
    tv="$("$PY" -c 'import torch; v = torch.__version__.split("+")[0].split("."); print(f"0.{int(v[1]) + 15}.*" if v[0] == "2" else "")')"
    if [ -z "$tv" ]; then
      echo "run.sh: no torchvision build known for this torch: the torchvision and timm tests skip" >&2
    elif ! { "$PY" -m pip install -q --no-deps "torchvision==$tv" timm && "$PY" -c "import torchvision, timm"; } >/dev/null 2>&1; then
      "$PY" -m pip uninstall -q -y torchvision timm >/dev/null 2>&1 || true
      echo "run.sh: torchvision==$tv does not import beside this torch (a CPU torch needs its CPU build): removed; the torchvision and timm tests skip" >&2
    fi
  fi
  echo "$want" > "$stamp"
fi

# The project's bytecode, written once: every rank is a fresh interpreter, and where PYTHONDONTWRITEBYTECODE is set
# (as in many CI images) each one would compile the launcher's modules again (~0.5 s of CPU a process). compileall
# skips what is up to date; an edited module is compiled in memory until the next run.sh.
"$PY" -m compileall -q -j 0 "$ROOT/launcher" "$ROOT/recipes" >/dev/null || true

if [ "${1:-}" = "test" ]; then
  shift
  cd "$ROOT"
  # Two pytest-xdist workers (one a core), a whole test file each at a time (module fixtures are shared): the suite
  # is bound by CPU, and a third worker made it no faster (docs/ci.md). HL_TEST_WORKERS=0 runs every test in this one
  # process (-s, --pdb).
  # --durations=25: CI's log names the slowest tests. The order the workers take the files in: tests/conftest.py.
  exec "$PY" -m pytest -n "${HL_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
fi
exec "$VENV/bin/hetero-launch" "$@"
