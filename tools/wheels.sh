#!/usr/bin/env bash
# The wheels that tools/gpu_check.sh's phase 2 installs on a CUDA node without network, whose python3 (CPython 3.12,
# manylinux x86_64) has torch, timm and pytest but not nbdev: nbdev==2.4.14, execnb<0.2, fastcore<1.15 and everything
# they need, recursively (IPython and its dependencies, PyYAML, watchdog, ghapi, astunparse, ...), one version each,
# binary wheels only, resolved by pip for that Python and platform (not this machine's; for another Python, change
# --python-version in TAGS below). Run it where there is network.
#
#   bash tools/wheels.sh [DIR]        # default gpu_wheels/ (git ignores it); then copy it with the checkout to the node
#
# Every dependency is included, also those the node may already have (packaging, PyYAML, Pygments, psutil, six,
# typing_extensions, setuptools, httpx, ...): on PYTHONPATH they shadow its copies in phase 2's processes only, and the
# wheels' versions are the ones nbdev's resolver chose. DIR is replaced whole, so no stale second version is left in it.
# It then installs DIR's wheels into a scratch folder as the node will (pip --no-index --no-deps --target, the tags
# checked for CPython 3.12 manylinux) and imports nbdev, execnb, fastcore and IPython from there with CHECK_PYTHON
# (default: python3.12 if there is one, else python3); the folder must stay under 64 MiB, small enough to copy along.
# Environment: PYTHON (default python3), whose pip downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu_wheels}
PY=${PYTHON:-python3}
REQS=('nbdev==2.4.14' 'execnb<0.2' 'fastcore<1.15')
TAGS=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
LIMIT_MIB=64

new=$(mktemp -d "${TMPDIR:-/tmp}/t2t_wheels.XXXXXX")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/t2t_wheels_check.XXXXXX")
trap 'rm -rf "$new" "$scratch"' EXIT
echo "wheels: downloading ${REQS[*]} and their dependencies for CPython 3.12 manylinux x86_64 into $DIR/"
"$PY" -m pip download -q --disable-pip-version-check "${TAGS[@]}" -d "$new" "${REQS[@]}"

# one version of each distribution (pip's normalised names), or the node's install stops
dupes=$(for f in "$new"/*.whl; do basename "$f" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'; done | sort | uniq -d)
[ -z "$dupes" ] || { echo "wheels: more than one version of: $dupes" >&2; exit 1; }
n=$(find "$new" -name '*.whl' | wc -l)
kib=$(du -sk "$new" | cut -f1)
[ "$kib" -lt $((LIMIT_MIB * 1024)) ] || { echo "wheels: $((kib / 1024)) MiB is over the limit of $LIMIT_MIB MiB" >&2; exit 1; }

# install as the node will, and import from the scratch folder
CHECK_PY=${CHECK_PYTHON:-}
if [ -z "$CHECK_PY" ]; then
  if python3.12 -c '' 2>/dev/null; then CHECK_PY=python3.12; else CHECK_PY=python3; fi
fi
"$CHECK_PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir "${TAGS[@]}" \
  --target "$scratch" "$new"/*.whl
ver=$(PYTHONPATH=$scratch "$CHECK_PY" - "$scratch" <<'EOF'
import platform, sys
import nbdev, execnb, fastcore, IPython
for m in (nbdev, execnb, fastcore, IPython):
    assert m.__file__.startswith(sys.argv[1]), f"{m.__name__} came from {m.__file__}, not the scratch folder"
print(f"Python {platform.python_version()} ({sys.executable}): nbdev {nbdev.__version__}, execnb {execnb.__version__}, "
      f"fastcore {fastcore.__version__}, IPython {IPython.__version__}")
EOF
)
[ -x "$scratch/bin/nbdev_test" ] || { echo "wheels: pip --target wrote no bin/nbdev_test (phase 2 runs it)" >&2; exit 1; }

rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
mv "$new" "$DIR"
chmod 755 "$DIR"
ls "$DIR"
echo "wheels: $n wheels, $(du -sh "$DIR" | cut -f1) in $DIR/ (limit $LIMIT_MIB MiB); installed into a scratch folder and imported with $ver"
case $ver in "Python 3.12"*) ;; *) echo "wheels: note: that Python is not 3.12 (the node's): the compiled parts of the cp312 wheels (PyYAML's) were not loaded" ;; esac
