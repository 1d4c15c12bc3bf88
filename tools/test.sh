#!/usr/bin/env bash
# The project's test command (README Quickstart, and what CI's .ci/run calls):
#   1. set up: a virtual environment in .venv with the project and its dev, timm, export and docs extras
#      (the tests of chapters 22 and 24 need timm, onnx and onnxruntime; tests/test_site.py builds two pages of the
#      website with the docs extra's Jupyter Book);
#   2. fail if nbdev_clean or nbdev_export changes any file (notebooks not clean, or the
#      library out of sync with them);
#   3. run the notebooks as tests (nbdev_test), then pytest on two processes (PYTEST_WORKERS), ending on pytest's
#      summary line.
# Environment: PYTHON (interpreter for the venv, default python3), VENV (default .venv), PYTEST_WORKERS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

echo "== set up: $VENV with t2t_course[dev,timm,export,docs]"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[dev,timm,export,docs]"

# A fingerprint of the working tree: status, diff, and the content of untracked files.
snapshot() {
  git status --porcelain=v1 --untracked-files=all
  git diff --binary
  git ls-files --others --exclude-standard -z | xargs -0 -r sha1sum
}

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

echo "== nbdev_test (skips cells flagged: $(sed -n 's/^tst_flags *= *//p' settings.ini))"
nbdev_test --timing

PYTEST_WORKERS=${PYTEST_WORKERS:-2}
echo "== pytest on $PYTEST_WORKERS worker processes (pytest-xdist; PYTEST_WORKERS=1 for one process)"
if [ "$PYTEST_WORKERS" -gt 1 ]; then python -m pytest -q -n "$PYTEST_WORKERS" tests; else python -m pytest -q tests; fi
