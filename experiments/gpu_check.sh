#!/usr/bin/env bash
# Prepared GPU check (H100/H200 class): CUDA jaxlib, then train_step (base and big, bf16, at a
# realistic token batch) and decode, printing bench.py's JSON lines (MFU against the bf16 peak
# that `peak` measures in the same process). Whole script: < 5 minutes of wall clock.
#
# Without an NVIDIA GPU it runs a reduced mode (tiny shapes, no install), so the script is known
# to work before it first meets a GPU:  bash experiments/gpu_check.sh
# Environment: PYTHON (default: python3, or the active venv), GPU_CHECK_BUDGET_S (default 290).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET_S:-290}"
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

run() {  # run <seconds> <args...>: one bench.py call, cut off at its share of the budget
  local limit=$1; shift
  local remain; remain=$(left)
  (( limit > remain )) && limit=$remain
  if (( limit < 10 )); then echo "{\"bench\": \"skipped\", \"args\": \"$*\", \"error\": \"out of time\"}"; return; fi
  timeout "$limit" "$PY" experiments/bench.py "$@" 2> >(grep -v -i warning >&2) \
    || echo "{\"bench\": \"failed\", \"args\": \"$*\", \"rc\": $?, \"limit_s\": $limit}"
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  MODE=gpu
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2
  if ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
    CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -1)
    EXTRA=cuda12; [[ "${CUDA_MAJOR:-12}" -ge 13 ]] && EXTRA=cuda13
    echo "installing jax[$EXTRA] (driver CUDA ${CUDA_MAJOR:-?})" >&2
    timeout 150 "$PY" -m pip install -q -U "jax[$EXTRA]" >&2 \
      || timeout 60 "$PY" -m pip install -q -U "jax[cuda12]" >&2 || true
    "$PY" -m pip install -q -e . >/dev/null 2>&1 || true
  fi
  if ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
    echo '{"bench": "gpu_check", "error": "no CUDA jaxlib: jax does not see the GPU"}'
    exit 1
  fi
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
  COMMON=(--config.model.dtype=bfloat16 --reps=5 --warmup=2)
  # base: 25,600 target tokens ([400, 64] a side), the paper's ~25k-token batch (§5.1)
  run 100 peak train_step --config=configs/base.py --batch=400 --length=64 "${COMMON[@]}"
  # big: the same token batch (fits easily in 80+ GiB; §5.2 trained it at 25k tokens a step too)
  run 110 train_step --config=configs/big.py --batch=400 --length=64 "${COMMON[@]}"
  # decode needs a test split: the small config's Multi30k (shared/data) if this checkout has it
  run 60 decode --config=configs/small.py --config.model.dtype=bfloat16 --decode_limit=256
else
  MODE=cpu-reduced
  echo "no NVIDIA GPU: reduced mode (tiny shapes, no install)" >&2
  TINY=(--config=configs/small.py --config.model.vocab_size=512 --config.model.num_layers=1
        --config.model.d_model=64 --config.model.d_ff=128 --config.model.num_heads=2
        --config.model.d_k=32 --config.model.d_v=32 --batch=16 --length=16 --reps=2 --peak_n=256)
  run 60 peak train_step "${TINY[@]}" --variant=bf16:model.dtype=bfloat16
  run 60 train_step --config=configs/big.py --config.model.vocab_size=512 --config.model.num_layers=1 \
    --config.model.d_model=64 --config.model.d_ff=128 --config.model.num_heads=2 \
    --config.model.d_k=32 --config.model.d_v=32 --config.model.dtype=bfloat16 \
    --batch=16 --length=16 --reps=2 --peak_n=256
  run 90 decode --config=configs/small.py --config.model.num_layers=1 --decode_limit=16
fi
echo "{\"bench\": \"gpu_check\", \"mode\": \"$MODE\", \"wall_s\": $(( $(date +%s) - START ))}"
