#!/usr/bin/env bash
# The GPU check, for a CUDA node without network (a cluster's compute node, say) whose python3 holds torch (a CUDA
# build), torchvision, timm and pytest but not nbdev. Phase 1 installs nothing and runs the checkout in place (on
# PYTHONPATH); the project need not be installed. A GPU node's time is often short (a queue's limit, a reserved slot):
# each phase is bounded by the sum of its steps' limits, so that a failed phase can run again in the same slot.
#
#   bash tools/gpu_check.sh [OUTDIR]               # phase 1: preflight, pytest -m cuda, both benchmarks (limits: 300 s)
#   bash tools/gpu_check.sh --phase 2 [OUTDIR]     # phase 2: the notebooks' #| cuda cells, nbdev from the wheel folder
#                                                  #   (made where there is network by bash tools/wheels.sh; limits: 180 s)
#   bash tools/gpu_check.sh --dry-run [OUTDIR]     # phase 1's commands on the CPU with tiny sizes (a minute or two)
#   bash tools/gpu_check.sh [--phase 2] [--dry-run] --plan    # print the steps and their limits, run nothing
#
# Phase 1: preflight 30 s (torch imports, sees a CUDA GPU, runs a kernel; else one line saying what is missing, and
# exit 1), nvidia-smi 10 s (for the record only), pytest -m cuda 75 s on the test modules that name the cuda mark, with
# T2T_REQUIRE_CUDA=1 (a skipped cuda test fails), benchmarks/data_pipeline.py --quick 50 s (the CPU pipelines, then fast
# and gpu on the GPU), benchmarks/gpu_train.py 135 s (batch 64 and 256, eager and compiled; the loader), last.
# Phase 2: preflight 15 s, install 20 s (the wheels into /tmp/t2t_site, on PYTHONPATH after the checkout), then
# nbdev_test --flags cuda on each notebook with #| cuda cells (12c_gpu 45 s, 18d_loop 100 s, any other 60 s).
# The limits are estimates: no step has been timed on a GPU. The dry run has no GPU number.
#
# OUTDIR (default gpu_logs/<date-time>/) is the folder to copy back from the node: one log per step and summary.txt, at
# most 8 files with plain names (letters, digits, '.', '_', '-'). Every step has a time limit (timeout, then KILL 5 s
# later); the exit status is 0 only if every step passed. Environment: PYTHON (default python3), the interpreter to use.
set -uo pipefail

usage() {
  sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --phase 1|2     which phase (default 1)
  --dry-run       CPU in place of CUDA, tiny sizes, T2T_REQUIRE_CUDA unset (the cuda tests skip); same files and summary
  --plan          print the plan (steps, limits, commands) and exit
  --wheels DIR    phase 2's wheel folder (default the checkout's gpu_wheels/, made where there is network by: bash tools/wheels.sh)
  -h, --help      this text
EOF
}

PHASE=1 DRY=0 PLAN_ONLY=0 OUTDIR='' WHEELS=''
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --phase) [ $# -ge 2 ] || { echo "gpu_check: --phase needs 1 or 2" >&2; exit 2; }; PHASE=$2; shift 2 ;;
    --phase=*) PHASE=${1#*=}; shift ;;
    --wheels) [ $# -ge 2 ] || { echo "gpu_check: --wheels needs a folder" >&2; exit 2; }; WHEELS=$2; shift 2 ;;
    --wheels=*) WHEELS=${1#*=}; shift ;;
    --dry-run) DRY=1; shift ;;
    --plan) PLAN_ONLY=1; shift ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$OUTDIR" ] || { echo "gpu_check: one OUTDIR only (got '$OUTDIR' and '$1')" >&2; exit 2; }; OUTDIR=$1; shift ;;
  esac
done
case $PHASE in 1|2) ;; *) echo "gpu_check: --phase is 1 or 2, not '$PHASE'" >&2; exit 2 ;; esac

# paths given relative to the caller's folder, then the repository root as the working folder
abspath() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
[ -z "$OUTDIR" ] || OUTDIR=$(abspath "$OUTDIR")
[ -z "$WHEELS" ] || WHEELS=$(abspath "$WHEELS")
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
WHEELS=${WHEELS:-$REPO/gpu_wheels}
[ -n "$OUTDIR" ] || OUTDIR=$REPO/gpu_logs/$(date +%Y%m%d-%H%M%S)

PY=${PYTHON:-python3}
BUDGET=$([ "$PHASE" = 1 ] && echo 300 || echo 180)
SITE=/tmp/t2t_site
[ "$DRY" = 1 ] && SITE=${TMPDIR:-/tmp}/t2t_site_dry
export PYTHONUNBUFFERED=1 PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ "$DRY" = 1 ]; then unset T2T_REQUIRE_CUDA; else export T2T_REQUIRE_CUDA=1; fi

# The preflight: python imports torch, sees a CUDA GPU (the dry run: the CPU) and runs a kernel; else one line
# "gpu_check: ..." saying what is missing, and exit 3. It also prints the versions that summary.txt reports.
PREFLIGHT=$(cat <<'EOF'
import platform, sys
mode, name = sys.argv[1], sys.argv[2]
def stop(msg): print("gpu_check: " + msg, flush=True); sys.exit(3)
def first(e): return f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0]
print(f"python: {platform.python_version()} ({sys.executable})")
try: import torch
except Exception as e: stop(f"{name} has no torch: {first(e)} ({sys.executable}, Python {platform.python_version()})")
built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
print(f"torch: {torch.__version__} ({built}, cuDNN {torch.backends.cudnn.version()})")
from importlib.metadata import version  # the versions installed (importing them is the tests' part, and slow)
for mod in ("torchvision", "timm"):
    try: print(f"{mod}: {version(mod)}")
    except Exception as e: print(f"{mod}: not installed: {first(e)}")
if mode == "cpu":
    x = torch.arange(1024.)
    if (x * 2).sum().item() != 1024 * 1023: stop("a CPU kernel gave a wrong sum")
    print("device: CPU (dry run: no CUDA checked)"); print("kernel: a CPU kernel ran, its sum right"); sys.exit(0)
if not torch.cuda.is_available():
    try: torch.cuda.init(); why = "torch.cuda.is_available() is False"
    except Exception as e: why = first(e)
    stop(f"no usable CUDA GPU: {why} (torch {torch.__version__}, {built})")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"device: {p.name} (cuda:{i}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
          f"{p.multi_processor_count} SMs)")
try:
    x = torch.arange(1024., device="cuda"); s = (x * 2).sum().item(); torch.cuda.synchronize()
except Exception as e: stop(f"a CUDA GPU is seen but a kernel on it failed: {first(e)}")
if s != 1024 * 1023: stop(f"a CUDA kernel gave a wrong sum: {s}")
print("kernel: a CUDA kernel ran, its sum right")
EOF
)
# Phase 2's install check: nbdev, execnb, fastcore and IPython import, each from the wheel folder's target (argv[1]).
IMPORTCHECK=$(cat <<'EOF'
import sys, nbdev, execnb, fastcore, IPython
for m in (nbdev, execnb, fastcore, IPython):
    print(m.__name__, m.__version__, m.__file__)
    if not m.__file__.startswith(sys.argv[1]): sys.exit(f"gpu_check: {m.__name__} is imported from {m.__file__}, not {sys.argv[1]}")
EOF
)
export PREFLIGHT IMPORTCHECK

declare -a NAMES LIMITS LOGS CMDS KINDS
plan_add() {  # plan_add NAME LIMIT LOG KIND CMD: KIND scored (counts for the exit status) or info (never fails the run)
  NAMES+=("$1"); LIMITS+=("$2"); LOGS+=("$3"); KINDS+=("$4"); CMDS+=("$5")
}
q() { printf '%q' "$1"; }

# the test modules (in tests/ and its folders) that mention the cuda mark (a decorator, pytestmark, parametrize's marks=;
# a mere mention costs only its collection, and every cuda-marked test then runs: pytest -m cuda deselects the rest)
cuda_modules() { grep -rl --include='test_*.py' 'mark\.cuda' tests 2>/dev/null | LC_ALL=C sort | paste -sd' ' -; }
cuda_notebooks() { grep -lE '^ *"#\| cuda\\n",?$' nbs/*.ipynb 2>/dev/null; }   # a code cell whose first line is #| cuda
nb_limit() {  # seconds for one notebook's run (whole, its #| cuda cells included), by estimate: never measured on a GPU
  if [ "$DRY" = 1 ]; then echo 240; return; fi  # on 2 shared CPU cores the two notebooks took 22-48 s and 58-119 s
  case $(basename "$1") in 12c_gpu.ipynb) echo 45 ;; 18d_loop.ipynb) echo 100 ;; *) echo 60 ;; esac
}

if [ "$PHASE" = 1 ]; then
  MODE=$([ "$DRY" = 1 ] && echo cpu || echo cuda)
  plan_add preflight 30 preflight.log scored "$(q "$PY") -c \"\$PREFLIGHT\" $MODE $(q "$PY")"
  plan_add nvidia-smi 10 nvidia-smi.txt info \
    "if command -v nvidia-smi >/dev/null; then nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv; else echo 'nvidia-smi: not on PATH'; exit 1; fi"
  mods=$(cuda_modules)
  [ -n "$mods" ] || mods='tests/'  # no module marks a cuda test: pytest then says so (no tests ran: exit 5)
  plan_add pytest_cuda 75 pytest_cuda.log scored "$(q "$PY") -m pytest -q -m cuda -rA -p no:cacheprovider $mods"
  if [ "$DRY" = 1 ]; then
    plan_add data_pipeline 50 data_pipeline.log scored \
      "$(q "$PY") benchmarks/data_pipeline.py --files 2 --rounds 1 --images 32 --img-size 64"
    plan_add gpu_train 135 gpu_train.log scored "$(q "$PY") benchmarks/gpu_train.py --device cpu --smoke"
  else
    # the CPU pipelines' comparison in 2 rounds of 64 images, then fast and gpu on the GPU with 1, 4 and 8 workers
    plan_add data_pipeline 50 data_pipeline.log scored "$(q "$PY") benchmarks/data_pipeline.py --quick --rounds 2 --images 64"
    # last, as the longest and least certain (2 compiles, most of its time): batch 64 and 256, eager and compiled; the
    # loader with 1 and 8 workers. Its log keeps what it printed before a time-out (unbuffered output).
    plan_add gpu_train 135 gpu_train.log scored \
      "$(q "$PY") benchmarks/gpu_train.py --steps 10 --warmup 2 --workers 1 8 --loader-images 100 --loader-files 200"
  fi
else
  MODE=$([ "$DRY" = 1 ] && echo cpu || echo cuda)
  plan_add preflight 15 preflight.log scored "$(q "$PY") -c \"\$PREFLIGHT\" $MODE $(q "$PY")"
  tags=''
  if [ "$DRY" = 1 ]; then  # wheels for the GPU node's CPython 3.12: pip checks their tags as if it were that one
    tags='--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64'
  fi
  plan_add install 20 install.log scored \
    "rm -rf $(q "$SITE") && $(q "$PY") -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade $tags --target $(q "$SITE") $(q "$WHEELS")/*.whl && PYTHONPATH=$(q "$REPO:$SITE") $(q "$PY") -c \"\$IMPORTCHECK\" $(q "$SITE")"
  for nb in $(cuda_notebooks); do
    stem=$(basename "$nb" .ipynb)
    plan_add "nb_$stem" "$(nb_limit "$nb")" "nb_$stem.log" scored \
      "PYTHONPATH=$(q "$REPO:$SITE") IPYTHONDIR=/tmp/t2t_ipython $(q "$PY") $(q "$SITE")/bin/nbdev_test --flags cuda --path $(q "$nb")"
  done
fi

TOTAL=0
for l in "${LIMITS[@]}"; do TOTAL=$((TOTAL + l)); done
print_plan() {
  local budget="budget $BUDGET s"
  [ "$DRY" = 1 ] && [ "$TOTAL" -gt "$BUDGET" ] && budget="the phase's budget on a GPU is $BUDGET s: the dry run gives the CPU's notebooks longer"
  echo "gpu_check plan: phase $PHASE$([ "$DRY" = 1 ] && echo ', dry run (CPU, tiny sizes)'), ${#NAMES[@]} steps, limits sum to $TOTAL s ($budget); logs in $OUTDIR"
  local i
  for i in "${!NAMES[@]}"; do
    printf '  %-16s limit %4ss  %s%s\n' "${NAMES[$i]}" "${LIMITS[$i]}" "$([ "${KINDS[$i]}" = info ] && echo '(info) ')" "${CMDS[$i]}"
  done
  [ "$TOTAL" -le "$BUDGET" ] || [ "$DRY" = 1 ] || echo "gpu_check: warning: the limits ($TOTAL s) are over the phase's budget ($BUDGET s)"
}
print_plan
[ "$PLAN_ONLY" = 1 ] && exit 0

if [ "$PHASE" = 2 ] && ! compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "gpu_check: no wheels in $WHEELS (phase 2 installs nbdev from it): make it with 'bash tools/wheels.sh' on a machine with network, and copy it to this one" >&2
  exit 2
fi
mkdir -p "$OUTDIR" || { echo "gpu_check: cannot make OUTDIR $OUTDIR" >&2; exit 2; }

declare -a RESULTS
status=0 T_START=$SECONDS
run_step() {  # run_step INDEX: the command under timeout, its output in OUTDIR/LOG
  local i=$1 name=${NAMES[$1]} limit=${LIMITS[$1]} log=$OUTDIR/${LOGS[$1]} t0=$SECONDS rc verdict
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" bash -c "${CMDS[$i]}" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then verdict=PASS; elif [ "${KINDS[$i]}" = info ]; then verdict=INFO; else verdict=FAIL; status=1; fi
  local why=''
  case $rc in 124|137) why=", timed out at ${limit}s" ;; 127) why=', command not found' ;; esac
  RESULTS+=("$(printf '%-4s %-16s %4ss  exit %3s  (limit %ss%s)  %s' "$verdict" "$name" "$((SECONDS - t0))" "$rc" "$limit" "$why" "${LOGS[$i]}")")
  echo "${RESULTS[-1]}"
  if [ "$verdict" = FAIL ] && [ "$name" != preflight ]; then tail -n 12 "$log" | sed 's/^/   | /'; fi
  return $rc
}

info_line() { grep -m1 "^$1: " "$OUTDIR/preflight.log" 2>/dev/null | cut -d' ' -f2-; }
write_summary() {
  local s=$OUTDIR/summary.txt tmp
  tmp=$(mktemp) || return 1
  {
    echo "gpu_check phase $PHASE$([ "$DRY" = 1 ] && echo ' (dry run: CPU, tiny sizes; no GPU number below is one)'), $(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - T_START)) s, host $(hostname 2>/dev/null)"
    echo "python:      $(info_line python)"
    local dev; dev=$(grep '^device: ' "$OUTDIR/preflight.log" 2>/dev/null | cut -d' ' -f2- | paste -sd';' -)
    echo "device:      ${dev:-none (the preflight stopped: its line below)}"
    echo "torch:       $(info_line torch)"
    echo "torchvision: $(info_line torchvision); timm: $(info_line timm)"
    local smi
    smi=$(grep -A1 '^name, driver_version' "$OUTDIR/nvidia-smi.txt" 2>/dev/null | sed -n 2p)
    [ -z "$smi" ] || echo "nvidia-smi:  $smi (name, driver, memory, max SM clock, power limit)"
    smi=$(grep -m1 -o 'CUDA Version: [0-9.]*' "$OUTDIR/nvidia-smi.txt" 2>/dev/null)
    [ -z "$smi" ] || echo "driver:      up to $smi"
    local g; g=$(grep -h '^gpu_check: ' "$OUTDIR/preflight.log" 2>/dev/null)
    [ -z "$g" ] || echo "$g"
    echo
    echo "steps (limits sum to $TOTAL s, budget $BUDGET s):"
    printf '  %s\n' "${RESULTS[@]}"
    local i
    for i in "${!NAMES[@]}"; do  # the steps that never ran (after a failed preflight)
      printf '%s\n' "${RESULTS[@]}" | grep -q " ${NAMES[$i]} " || printf '  %-4s %-16s (not run)\n' SKIP "${NAMES[$i]}"
    done
    local f=$OUTDIR/pytest_cuda.log
    if [ -s "$f" ]; then
      echo; echo "pytest -m cuda: $(grep -E '[0-9]+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed)' "$f" | tail -1)"
      grep -E '^(FAILED|ERROR) ' "$f" | head -8 | sed 's/^/  /'
      [ "$DRY" = 1 ] || grep -E '^SKIPPED ' "$f" | head -4 | sed 's/^/  /'
    fi
    f=$OUTDIR/gpu_train.log
    if [ -s "$f" ]; then
      echo; echo "gpu_train.py:"
      grep -E '^(device: |peak: |train batch|batch [0-9]+: compiled|loader |to feed|total )' "$f" | cut -c1-150 | sed 's/^/  /'
    fi
    f=$OUTDIR/data_pipeline.log
    if [ -s "$f" ]; then
      echo; echo "data_pipeline.py (img/s):"
      grep -E '(img/s per worker|^goal:|pipeline on |^gpu pipeline: |^total )' "$f" | cut -c1-150 | sed 's/^/  /'
    fi
    for f in "$OUTDIR"/nb_*.log "$OUTDIR/install.log"; do
      [ -s "$f" ] || continue
      echo; echo "$(basename "$f"):"; grep -vE '^\s*$' "$f" | tail -n 4 | cut -c1-150 | sed 's/^/  /'
    done
    echo
    local n bad
    n=$(find "$OUTDIR" -type f ! -path "$s" | wc -l); n=$((n + 1))  # summary.txt included
    bad=$(find "$OUTDIR" -mindepth 1 | sed "s|^$OUTDIR/||" | grep -vE '^([A-Za-z0-9._-]+/){0,2}[A-Za-z0-9._-]+$')
    if [ "$n" -gt 8 ] || [ -n "$bad" ]; then
      echo "FAIL outputs: $n files in $OUTDIR (at most 8 to copy back, named in letters, digits, '.', '_', '-', 2 folders deep)${bad:+; bad: $bad}"
      status=1
    else echo "outputs: $n files in $OUTDIR (at most 8 to copy back)"; fi
    echo "result: $([ $status = 0 ] && echo PASS || echo FAIL)"
  } >"$tmp"
  mv "$tmp" "$s" && chmod 644 "$s"
  grep -q '^FAIL outputs' "$s" && status=1
}

for i in "${!NAMES[@]}"; do
  run_step "$i"; rc=$?
  if [ "${NAMES[$i]}" = preflight ] && [ $rc -ne 0 ]; then
    line=$(grep -m1 '^gpu_check: ' "$OUTDIR/preflight.log")
    if [ -z "$line" ]; then
      case $rc in
        124|137) line="gpu_check: the preflight did not finish within ${LIMITS[$i]}s (a hung CUDA driver or import?): $OUTDIR/preflight.log" ;;
        126|127) line="gpu_check: cannot run the interpreter '$PY' (exit $rc): $(tail -n 1 "$OUTDIR/preflight.log")" ;;
        *) line="gpu_check: the preflight failed (exit $rc): $(tail -n 1 "$OUTDIR/preflight.log")" ;;
      esac
      echo "$line" >>"$OUTDIR/preflight.log"
    fi
    status=1; write_summary
    echo "$line" >&2
    exit 1
  fi
done

write_summary
echo "== summary ($OUTDIR/summary.txt)"
cat "$OUTDIR/summary.txt"
exit $status
