#!/usr/bin/env bash
# The project's test command (README Quickstart, and what CI's .ci/run calls):
#   1. set up: a virtual environment in .venv with the project and its dev, timm, export and docs extras (seeing the
#      torch and torchvision of PYTHON where it has them, instead of installing its own)
#      (the tests of chapters 22 and 24 need timm, onnx and onnxruntime; tests/tools/test_site.py builds two pages of the
#      website with the docs extra's Jupyter Book);
#   2. fail if nbdev_clean or nbdev_export changes any file (notebooks not clean, or the
#      library out of sync with them);
#   3. run the notebooks as tests (nbdev_test), then pytest on two processes (PYTEST_WORKERS), ending on pytest's
#      summary line.
# Environment: PYTHON (interpreter for the venv, default python3), VENV (default .venv), PYTEST_WORKERS (default 2),
# INSTALLER (uv, the default where PYTHON has torch; or pip).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

START=$SECONDS
took() { echo "   ($1: $((SECONDS - START)) s since the start)"; }
echo "== set up: $VENV with t2t_course[dev,timm,export,docs,tensorboard]"
if [ ! -x "$VENV/bin/python" ]; then
  # torch and torchvision already installed for PYTHON (GBs with CUDA): the venv sees them instead of installing its own
  if "$PYTHON" -c 'import torch, torchvision' 2>/dev/null; then "$PYTHON" -m venv --system-site-packages "$VENV"
  else "$PYTHON" -m venv "$VENV"; fi
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
# Where the venv inherits PYTHON's torch and torchvision, the rest is installed with uv (its resolution of the same
# requirements, from PyPI, in about 10 s where pip takes 30-60 s). uv neither sees inherited packages nor reads pip's
# configuration, so torch and torchvision are taken out of its resolution (an override whose marker never holds) and
# the venv keeps PYTHON's; it installs its own copies of the other packages PYTHON has. Without an inherited torch
# (pip then installs it, and honours this machine's pip configuration: its indexes, its torch constraint), or with
# INSTALLER=pip, or where uv cannot be fetched, pip installs everything.
INSTALLER=${INSTALLER:-uv}
if [ "$INSTALLER" = uv ] && grep -q '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg" \
   && python -c 'import torch, torchvision' 2>/dev/null && python -m pip install --quiet uv 2>/dev/null; then
  printf '%s\n' 'torch; sys_platform == "never"' 'torchvision; sys_platform == "never"' > "$VENV/uv-inherited.txt"
  python -m uv pip install --quiet --python "$VENV/bin/python" --override "$VENV/uv-inherited.txt" -e ".[dev,timm,export,docs,tensorboard]"
else
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet --no-compile -e ".[dev,timm,export,docs,tensorboard]"
fi
# Byte-code: the suite's processes (two runners, and over a hundred command lines started by the tests) import the
# same modules again and again. Each module is compiled once, by the first process that imports it, and kept (Python's
# own __pycache__ folders), whatever PYTHONDONTWRITEBYTECODE the machine sets; nothing is compiled at install time,
# where most of the ~1 GB the extras install (Jupyter's servers, the website's builder) is never imported by a test.
unset PYTHONDONTWRITEBYTECODE

# A fingerprint of the working tree: status, diff, and the content of untracked files.
snapshot() {
  git status --porcelain=v1 --untracked-files=all
  git diff --binary
  git ls-files --others --exclude-standard -z | xargs -0 -r sha1sum
}

took "set up"
echo "== nbdev_clean and nbdev_export must leave the tree unchanged"
before=$(snapshot | sha1sum)
nbdev_clean
nbdev_export
after=$(snapshot | sha1sum)
if [ "$before" != "$after" ]; then
  echo "FAIL: nbdev_clean / nbdev_export changed files: the notebooks are not clean or t2t_course/ is"
  echo "out of sync with nbs/. Run 'nbdev_clean && nbdev_export', review and commit. What changed:"
  git status --short --untracked-files=all
  git --no-pager diff --stat
  exit 1
fi

# Both test runners start one process per core (nbdev_test) or per PYTEST_WORKERS; torch's own threads on top of that
# only spin against each other: one thread per process unless OMP_NUM_THREADS says otherwise (measured on 2 cores:
# pytest on the model and timm tests 222 -> 120 s, nbdev_test 227 -> 199 s).
PYTEST_WORKERS=${PYTEST_WORKERS:-2}
CORES=$(python -c 'import os; print(len(os.sched_getaffinity(0)))')
OMP_SET=${OMP_NUM_THREADS:-}
export OMP_NUM_THREADS=${OMP_SET:-1}

echo "== nbdev_test (skips cells flagged: $(sed -n 's/^tst_flags *= *//p' settings.ini); $OMP_NUM_THREADS torch thread(s) a notebook)"
nbdev_test --timing
took "nbdev_test"

echo "== pytest on $PYTEST_WORKERS worker processes (pytest-xdist; PYTEST_WORKERS=1 for one process)"
# Only the plugins the suite uses (xdist, named below): not every pytest plugin the interpreter happens to have
# (hypothesis, anyio, benchmark plugins cost 1.5 CPU s in each of the suite's pytest processes, the ones the tests
# start included, and may warn under xdist).
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
if [ "$PYTEST_WORKERS" -gt 1 ]; then python -m pytest -q -p xdist.plugin -n "$PYTEST_WORKERS" tests
else OMP_NUM_THREADS=${OMP_SET:-$CORES} python -m pytest -q tests; fi   # its summary line, the last, gives its own time
