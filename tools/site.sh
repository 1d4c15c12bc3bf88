#!/usr/bin/env bash
# Builds the course's website into _site/ from the notebooks and their committed outputs (nothing is executed):
#   bash tools/site.sh            then open _site/index.html, or: python -m http.server -d _site 8000
# Every chapter of nbs/ in the course's parts, the overview as the home page, math rendered by a MathJax copy in
# _site/_static/mathjax/ (pages work offline, from file:// and over http), each chapter's notebook to download,
# an index of the library's names. Jupyter Book 1 (Sphinx + MyST-NB) builds it; tools/site/build.py says how.
# Needs no network but the package index, and that only once: the tools come from settings.ini's
# docs_requirements (the `docs` extra), installed into the virtual environment when missing.
# Also rewrites nbs/sidebar.yml (the Quarto sidebar, for nbdev_preview / nbdev_docs) from the same parts.
# Options go to tools/site/build.py: --out DIR, --only 00_overview,05_performer (a partial build), --jobs N, --fresh.
# Environment: PYTHON (interpreter for a new venv, default python3), VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "== site: a virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

# The docs extra's requirements, from its one line in settings.ini; installed only if one is missing.
read -r -a reqs <<< "$(sed -n 's/^docs_requirements *= *//p' settings.ini)"
if ! python - "${reqs[@]}" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    from packaging.requirements import Requirement
except ImportError:
    sys.exit(1)
for r in map(Requirement, sys.argv[1:]):
    try:
        if not r.specifier.contains(version(r.name), prereleases=True): sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
then
  echo "== site: installing the docs extra into $VENV: ${reqs[*]}"
  python -m pip install --quiet "${reqs[@]}"
fi

# The tools the build needs, checked before it starts (a full build takes minutes): the builder (Jupyter Book, from the
# docs extra above) and, until MathJax is in _site_build/cache/, npm to fetch it once.
if ! python -c 'import jupyter_book, myst_nb' 2>/dev/null; then
  echo "site: error: Jupyter Book is not importable in $VENV: pip install -e '.[docs]'" >&2; exit 1
fi
mathjax=$(sed -n "s/^MATHJAX = ('\([a-z]*\)', '\([0-9.]*\)').*/\1-\2/p" tools/site/build.py)
if [ ! -e "_site_build/cache/$mathjax/tex-svg-full.js" ] && ! command -v npm >/dev/null 2>&1; then
  echo "site: error: npm is needed once, to fetch MathJax ($mathjax) into _site_build/cache/; install Node.js (npm) first" >&2; exit 1
fi

python tools/site/build.py "$@"
