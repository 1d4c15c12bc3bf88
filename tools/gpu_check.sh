#!/usr/bin/env bash
# The first-GPU-run check, prepared for a CUDA machine (one H200: about 5-8 minutes, every step time-limited). Run from a set-up checkout
# (bash tools/test.sh first, or an activated environment with the dev extra):
#   bash tools/gpu_check.sh [LOG_DIR]          # logs default to gpu_logs/<date-time>/
# 1. preflight: torch must see a GPU (else it stops, with the CUDA runtime's reason: e.g. a driver too old for the wheel);
# 2. pytest -m cuda with T2T_REQUIRE_CUDA=1, so that no cuda test can skip silently;
# 3. the #| cuda cells of the notebooks that have them (nbdev_test --flags cuda runs those notebooks whole);
# 4. benchmarks/gpu_train.py (training img/s and MFU at batch 64 and 256, eager and compiled; the loader plain and pinned);
# 5. benchmarks/data_pipeline.py --quick (pil, draft and fast per worker; fast and gpu on the GPU with 1, 4, 8 workers).
# Each step has a time limit and its own log; the summary at the end says which passed. Exit status: 0 if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-gpu_logs/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$LOG"
export T2T_REQUIRE_CUDA=1 PYTHONWARNINGS=ignore
PY=${PYTHON:-python}
declare -a SUMMARY
status=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $LOG/NAME.log, note PASS/FAIL
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$LOG/$name.log"
  if [ $rc -eq 0 ]; then SUMMARY+=("PASS $name ($((SECONDS - t0))s)"); else SUMMARY+=("FAIL $name (exit $rc, $((SECONDS - t0))s): $LOG/$name.log"); status=1; fi
}

step preflight 120 "$PY" -c "
import sys, torch
print('torch', torch.__version__, 'built for CUDA', torch.version.cuda)
if not torch.cuda.is_available():
    try: torch.cuda.init()
    except Exception as e: sys.exit(f'no usable CUDA GPU: {type(e).__name__}: {e}')
    sys.exit('no usable CUDA GPU: torch.cuda.is_available() is False')
for i in range(torch.cuda.device_count()): print(i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
torch.ones(1, device='cuda').add_(1); torch.cuda.synchronize(); print('a kernel ran')"
if [[ "${SUMMARY[0]}" == FAIL* ]]; then echo "${SUMMARY[0]}"; exit 1; fi
nvidia-smi >"$LOG/nvidia-smi.txt" 2>&1 || true

step pytest_cuda 300 "$PY" -m pytest -q -m cuda tests -rA
step notebook_11_cuda 240 nbdev_test --flags cuda --path nbs/12_pipeline.ipynb
step notebook_17_cuda 240 nbdev_test --flags cuda --path nbs/18_train.ipynb
step gpu_train 360 "$PY" benchmarks/gpu_train.py --steps 15 --warmup 3 --workers 1 8
step data_pipeline 180 "$PY" benchmarks/data_pipeline.py --quick

echo "== summary (logs in $LOG)"
printf '%s\n' "${SUMMARY[@]}" | tee "$LOG/summary.txt"
exit $status
