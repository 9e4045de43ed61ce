#!/usr/bin/env bash
# The prepared GPU check for one H100/H200: the numbers that matter most first, each step under
# its own `timeout`, every JSON line written the moment it exists, so that a run cut short still
# leaves what it measured and shows where its time went. In order:
#   1. base train step, bf16, [400, 64] a side = 25,600 target tokens (§5.1's ~25k a side), with
#      the bf16 matmul peak for MFU: compile (lower_s, compile_s), then steps (step_s,
#      tokens_per_s, mfu)
#   2. big train step, the same batch
#   3. the quickstart end to end in runs/gpu_small (experiments/quickstart.sh: train the small
#      config on Multi30k, average, evaluate): one record with its BLEU, compile and train speed
#   4. beam-4 and greedy decoding of that trained model
#      (`python -m experiments.bench decode --workdir=runs/gpu_small`)
#   5. with what time is left: the base step again with model.scan_layers=True (compile and step
#      time of one scanned layer body against 1's unrolled stacks: picks the default)
#   6. with what time is left (GPU only): the base step again under XLA_FLAGS
#      --xla_gpu_autotune_level=0 (no GEMM/fusion autotuning) and then
#      --xla_gpu_enable_triton_gemm=false (cuBLAS for every GEMM): compile_s and step_s of each
#      against 1's defaults say where the GPU compile spends its time and what it buys
# Budget: 8 minutes on a fresh machine, set-up included (GPU_CHECK_BUDGET_S, default 470 s);
# each step gets at most its own limit and what is left, which is printed before it starts.
#
# Output: JSON lines on stdout, appended as they come to
# experiments/results/gpu_check_<UTC time>.jsonl (commit it); timestamped progress on stderr
# (`[+12.3s] base bf16 train step: ...`, the benchmarks' own lines stamped from the same start);
# the whole log in runs/gpu_check.log.
#
# The device image has JAX with CUDA, flax, optax, orbax, sentencepiece, sacrebleu and
# matplotlib, but not ml_collections, sacremoses or tensorboardX, and it reaches no registry; the
# ../shared data does not travel either. So first, here: `bash experiments/gpu_wheels.sh`
# (experiments/wheels/*.whl and experiments/data/multi30k, both gitignored), then with the
# device tool:
#   run(carry=["experiments/wheels", "experiments/data"], timeout_s=540,
#       command='bash experiments/gpu_check.sh; cp experiments/results/gpu_check_*.jsonl
#                runs/gpu_check.log runs/gpu_small/metrics.jsonl "$OUT"/')
# A wheel is installed (into a scratch --target, not the image) only if its module fails to
# import.
#
# Without an NVIDIA GPU (or with GPU_CHECK_MODE=cpu) the same steps run at tiny shapes on a tiny
# corpus in a minute or two, writing to a temporary folder (tests/integration/test_bench.py runs it).
# Environment: PYTHON (default python3), GPU_CHECK_MODE (gpu | cpu), GPU_CHECK_BUDGET_S,
# GPU_CHECK_OUT (the JSON lines file), GPU_CHECK_WORK (scratch folder), GPU_CHECK_DATA (Multi30k).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$EPOCHREALTIME
export BENCH_T0=$START  # python -m experiments.bench stamps its progress lines from the same start

since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "[+$(since "$START")s] $*" >&2; }
left() { awk -v a="$START" -v b="$EPOCHREALTIME" -v t="$BUDGET" 'BEGIN { printf "%d", t-(b-a) }'; }

json() {  # json KEY=VALUE...: one flat JSON object; numbers, true and false stay bare
  local kv value out=""
  for kv in "$@"; do
    value=${kv#*=}
    [[ $value =~ ^-?[0-9]+(\.[0-9]+)?$|^true$|^false$ ]] || value="\"$value\""
    out+="${out:+, }\"${kv%%=*}\": $value"
  done
  printf '{%s}' "$out"
}

MODE=${GPU_CHECK_MODE:-}
if [[ -z $MODE ]]; then
  MODE=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then MODE=gpu; fi
fi
if [[ $MODE == gpu ]]; then
  BUDGET=${GPU_CHECK_BUDGET_S:-470}
  WORK=${GPU_CHECK_WORK:-runs/gpu_check}
  RESULTS=${GPU_CHECK_OUT:-experiments/results/gpu_check_$(date -u +%Y%m%dT%H%M%SZ).jsonl}
  LOG=runs/gpu_check.log
  QS_DIR=runs/gpu_small
else
  BUDGET=${GPU_CHECK_BUDGET_S:-300}
  WORK=${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
  RESULTS=${GPU_CHECK_OUT:-$WORK/gpu_check.jsonl}
  LOG=$WORK/gpu_check.log
  QS_DIR=$WORK/small
  export JAX_PLATFORMS=cpu
fi
mkdir -p "$WORK/bin" "$(dirname "$RESULTS")" "$(dirname "$LOG")"
WORK=$(cd "$WORK" && pwd)
: >>"$RESULTS"
: >"$LOG"
FAILED=0

record() { printf '%s\n' "$1" | tee -a "$RESULTS"; }

finish() {  # the last record, whatever happened; exit 0 only when every step ran and passed
  say "done: $FAILED step(s) failed or skipped; results in $RESULTS"
  record "$(json bench=gpu_check "mode=$MODE" "wall_s=$(since "$START")" "budget_s=$BUDGET" \
    "failed=$FAILED" "results=$RESULTS")"
  exit $(( FAILED > 0 ))
}

route() {  # bench records to the results (and stdout); every other line to stderr
  local line
  while IFS= read -r line; do
    if [[ $line == '{"bench"'* ]]; then record "$line"; else printf '%s\n' "$line" >&2; fi
  done
}

step() {  # step NAME LIMIT_S COMMAND...: one piece under its own timeout; a failure is a record
  local name=$1 limit=$2 remain t0 rc took timed_out
  shift 2
  remain=$(left)
  (( limit > remain - 10 )) && limit=$(( remain - 10 ))  # 10 s: kill grace, the final record
  if (( limit < 10 )); then
    say "$name: skipped, ${remain} s of the ${BUDGET} s budget left"
    record "$(json bench=skipped "step=$name" "left_s=$remain")"
    FAILED=$(( FAILED + 1 ))
    return 1
  fi
  say "$name: up to ${limit} s (${remain} s of ${BUDGET} s left)"
  t0=$EPOCHREALTIME
  timeout -k 5 "$limit" "$@" </dev/null 2>&1 | tee -a "$LOG" | route
  rc=${PIPESTATUS[0]}
  took=$(since "$t0")
  if (( rc == 0 )); then
    say "$name: done in ${took} s"
    return 0
  fi
  timed_out=false
  (( rc == 124 || rc == 137 )) && timed_out=true
  say "$name: failed (exit $rc, timed out: $timed_out) after ${took} s"
  record "$(json bench=failed "step=$name" "exit=$rc" "timed_out=$timed_out" "limit_s=$limit" \
    "wall_s=$took")"
  FAILED=$(( FAILED + 1 ))
  return 1
}

# --- set-up ---------------------------------------------------------------------------------
# shellcheck source=experiments/device_env.sh
. experiments/device_env.sh
device_python "$WORK" || exit 1
say "mode $MODE, budget ${BUDGET} s, results in $RESULTS, python $PY"
device_wheels "$WORK" || { FAILED=$(( FAILED + 1 )); finish; }

GPU_NAME=""
if [[ $MODE == gpu ]]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)
  GPU_NAME=${GPU_NAME%%$'\n'*}
fi
export GPU_NAME MODE
# JAX's import and backend start, timed: where a run that printed nothing spent its time
# shellcheck disable=SC2016
step "start" 90 "$PY" -c '
import json, os, platform, sys, time
start = time.perf_counter()
import jax, jaxlib
imported = time.perf_counter()
backend = jax.default_backend()
devices = [str(d) for d in jax.devices()]
print(json.dumps({"bench": "gpu_check_start", "mode": os.environ["MODE"],
                  "gpu": os.environ["GPU_NAME"], "python": platform.python_version(),
                  "jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": backend,
                  "devices": devices, "import_s": round(imported - start, 2),
                  "backend_init_s": round(time.perf_counter() - imported, 2)}))
sys.exit(os.environ["MODE"] == "gpu" and backend != "gpu")
' || { say "JAX does not run here as mode $MODE needs: stopping"; finish; }

# --- 1, 2: base and big train steps ---------------------------------------------------------
if [[ $MODE == gpu ]]; then
  STEP_ARGS=(--config.model.dtype=bfloat16 --batch=400 --length=64 --reps=5 --warmup=2)
  LIMITS=(110 110 190 60)  # base, big, quickstart, decode
else  # tiny shapes: the same code paths in seconds
  STEP_ARGS=(--config.model.dtype=bfloat16 --config.model.vocab_size=512
             --config.model.num_layers=1 --config.model.d_model=64 --config.model.d_ff=128
             --config.model.num_heads=2 --config.model.d_k=32 --config.model.d_v=32
             --batch=16 --length=16 --reps=2 --warmup=1 --peak_n=256)
  LIMITS=(60 60 150 60)
fi
step "base bf16 train step" "${LIMITS[0]}" \
  "$PY" -m experiments.bench peak train_step --config=configs/base.py "${STEP_ARGS[@]}"
step "big bf16 train step" "${LIMITS[1]}" \
  "$PY" -m experiments.bench train_step --config=configs/big.py "${STEP_ARGS[@]}"

# --- 3: the quickstart end to end ------------------------------------------------------------
DATA=""
for d in "${GPU_CHECK_DATA:-}" experiments/data/multi30k ../shared/data/multi30k; do
  if [[ -n $d && -f $d/train.en ]]; then DATA=$(cd "$d" && pwd); break; fi
done
QS_ARGS=()
if [[ -n $DATA && $MODE == cpu ]]; then  # a tiny corpus and model, as tests/integration/test_readme.py runs
  mkdir -p "$WORK/multi30k"
  for split in train:1500 val:16 test_2016_flickr:16; do
    for lang in en de; do
      head -n "${split#*:}" "$DATA/${split%:*}.$lang" >"$WORK/multi30k/${split%:*}.$lang"
    done
  done
  DATA=$(cd "$WORK/multi30k" && pwd)
  QS_ARGS=(--config.model.vocab_size=256 --config.model.num_layers=1 --config.model.d_model=32
           --config.model.d_ff=64 --config.model.num_heads=2 --config.model.d_k=16
           --config.model.d_v=16 --config.model.max_len=64 --config.data.max_len=64
           --config.data.tokens_per_batch=512 --config.data.packed_length=64
           --config.optim.warmup_steps=20 --config.train.num_steps=12
           --config.train.log_every_steps=4 --config.train.eval_every_steps=6
           --config.train.checkpoint_every_steps=4 --config.train.average_last=2
           --config.decode.max_extra_len=10 --config.data.num_buckets=2)
fi
if [[ -z $DATA ]]; then
  say "quickstart: no Multi30k (run experiments/gpu_wheels.sh here and carry experiments/data)"
  record "$(json bench=quickstart "error=no Multi30k: carry experiments/data")"
  FAILED=$(( FAILED + 1 ))
else
  rm -rf "$QS_DIR"  # a check starts fresh: train would resume an old run's checkpoints
  QS_START=$EPOCHREALTIME
  step "quickstart" "${LIMITS[2]}" \
    bash experiments/quickstart.sh "$QS_DIR" "--config.data.dir=$DATA" "${QS_ARGS[@]}"
  QS_RC=$?
  # One record of what the run left, complete or not: BLEU, compile records, training speed.
  "$PY" - "$QS_DIR" "$(since "$QS_START")" "$QS_RC" <<'PY' | route
import json, os, sys

workdir, wall_s, rc = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
record = {"bench": "quickstart", "workdir": workdir, "wall_s": wall_s, "ok": rc == 0}
metrics = []
if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
train = [m for m in metrics if m["kind"] == "train"]
evals = [m for m in metrics if m["kind"] == "eval"]
record["compile"] = [
    {k: m.get(k) for k in ("step", "shape", "lower_s", "compile_s", "compilation_cache")}
    for m in metrics if m["kind"] == "compile"
]
if train:
    last = train[-1]
    record.update(train_steps=last["step"], final_loss=last["loss"])
    record["target_tokens_per_s"] = last["target_tokens_per_s"]
    record["steps_per_s"] = last["steps_per_s"]
if evals:
    record["val_ppl"] = evals[-1]["ppl"]
scores_log = os.path.join(workdir, "test_scores.log")
if os.path.exists(scores_log):
    with open(scores_log) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("{")]
    if lines:
        scores = json.loads(lines[-1])
        record.update(bleu=scores.get("bleu"), bleu_tok_compound=scores.get("bleu_tok_compound"))
        record["scores"] = scores
print(json.dumps(record))
PY

  # --- 4: decoding the trained model ---------------------------------------------------------
  if [[ -d $QS_DIR/checkpoints || -d $QS_DIR/averaged ]]; then
    DECODE_ARGS=()
    [[ $MODE == cpu ]] && DECODE_ARGS=(--decode_limit=16)
    step "beam-4 decode" "${LIMITS[3]}" \
      "$PY" -m experiments.bench decode "--workdir=$QS_DIR" "${DECODE_ARGS[@]}"
  else
    say "beam-4 decode: skipped, the quickstart left no checkpoint"
    record "$(json bench=skipped "step=beam-4 decode" "error=the quickstart left no checkpoint")"
    FAILED=$(( FAILED + 1 ))
  fi
fi

# --- 5: base with scanned layers, if time is left ------------------------------------------------
step "base bf16 scan_layers train step" "${LIMITS[0]}" \
  "$PY" -m experiments.bench train_step --config=configs/base.py --config.model.scan_layers=True \
  "${STEP_ARGS[@]}"

# --- 6: what XLA's GPU autotuner costs and buys, if time is left ----------------------------------
if [[ $MODE == gpu ]]; then
  for flags in "--xla_gpu_autotune_level=0" "--xla_gpu_enable_triton_gemm=false"; do
    XLA_FLAGS="${XLA_FLAGS:-} $flags" step "base bf16 train step, XLA_FLAGS=$flags" \
      "${LIMITS[0]}" "$PY" -m experiments.bench train_step --config=configs/base.py \
      "${STEP_ARGS[@]}"
  done
fi

finish
