#!/usr/bin/env bash
# Table 3's unfinished runs on a lent GPU, many at a time, inside one device call. The finished
# runs' results and their vocabulary are committed (experiments/results/table3_small_s1200_runs/),
# so the machine trains only what is missing, by the committed runs' own settings, and brings
# back a tarball of what it finished. Two sweeps run side by side:
#   1. the issue's unfinished rows, longest first: --rows=big,C1024,A32 --seeds=0,1
#   2. the pre-registered explanation runs:       --explain=all --seeds=0,1
# each `python -m experiments.table3 --preset=small --steps=1200 --root=runs/table3_small_s1200
# --parallel=N` (the CPU sweep's command, N runs at once, each its own process with its share
# of the GPU's memory). A run's numbers do not depend on what runs beside it; a GPU's bf16
# products round otherwise than a CPU's, and each result records its machine ("platform").
#
# First, here: `bash experiments/gpu_wheels.sh` (wheels and Multi30k, as for gpu_check.sh), then
# with the device tool:
#   run(carry=["experiments/wheels", "experiments/data"], timeout_s=590,
#       command='bash experiments/table3_device.sh; cp runs/table3_device/* "$OUT"/')
# and back here, the new results into the mirror, then the report:
#   tar -xzf /work/.device/N/results.tgz -C experiments/results/table3_small_s1200_runs
#   python -m experiments.table3 --preset=small --seeds=0,1 --steps=1200 --rows=<all 20> \
#       --root=runs/table3_small_s1200 --report_only
#
# Budget: TABLE3_DEVICE_BUDGET_S (default 560 s, set-up included). At the budget both sweeps are
# stopped (their process groups killed): a run cut off there is lost, so a result is only what
# finished. Whatever happened, runs/table3_device/ then holds results.tgz (every result.json
# this call finished, by its path in the mirror), log.txt (progress: every finished run's line,
# stamped) and the sweeps' own logs. Exit 0 when both sweeps finished everything.
#
# Without a GPU (or TABLE3_DEVICE_MODE=cpu; tests/integration/test_table3.py) the same script
# runs the micro preset on a corpus of TABLE3_DEVICE_DATA into TABLE3_DEVICE_WORK, in seconds.
# Environment: PYTHON (default python3), TABLE3_DEVICE_MODE (gpu | cpu), TABLE3_DEVICE_BUDGET_S,
# TABLE3_DEVICE_PARALLEL ("rows,explain" runs at once; default 5,7), TABLE3_DEVICE_EXPLAIN (the
# --explain names; default all, cpu: E), TABLE3_DEVICE_WORK,
# TABLE3_DEVICE_DATA, TABLE3_DEVICE_MIRROR (default: the committed mirror).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS

MODE=${TABLE3_DEVICE_MODE:-}
if [[ -z $MODE ]]; then
  MODE=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then MODE=gpu; fi
fi
WORK=${TABLE3_DEVICE_WORK:-runs/table3_device}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
LOG=$WORK/log.txt
: >"$LOG"
say() { echo "[+$(( SECONDS - START ))s] $*" | tee -a "$LOG" >&2; }

BUDGET=${TABLE3_DEVICE_BUDGET_S:-560}
IFS=, read -r PAR_ROWS PAR_EXPLAIN <<<"${TABLE3_DEVICE_PARALLEL:-5,7}"
if [[ $MODE == gpu ]]; then
  ROOT=runs/table3_small_s1200
  MIRROR=${TABLE3_DEVICE_MIRROR:-experiments/results/table3_small_s1200_runs}
  COMMON=(--preset=small --steps=1200 "--root=$ROOT" "--mirror=$MIRROR" --seeds=0,1)
  ROWS=big,C1024,A32
  EXPLAIN=${TABLE3_DEVICE_EXPLAIN:-all}
  # The committed runs read ../shared/data/multi30k (their data.dir, compared as the place
  # beside the checkout): the carried copy goes there, since ../shared does not travel.
  if [[ ! -f ../shared/data/multi30k/train.en ]]; then
    mkdir -p ../shared/data && cp -r experiments/data/multi30k ../shared/data/multi30k \
      || { say "no Multi30k: run experiments/gpu_wheels.sh here and carry experiments/data"; exit 1; }
  fi
else  # the micro preset on a tiny corpus: the same code paths in seconds
  export JAX_PLATFORMS=cpu
  ROOT=$WORK/root
  MIRROR=${TABLE3_DEVICE_MIRROR:-$WORK/mirror}
  COMMON=(--preset=micro "--root=$ROOT" "--mirror=$MIRROR" --seeds=0
          "--data_dir=${TABLE3_DEVICE_DATA:?TABLE3_DEVICE_DATA: a parallel-text folder}")
  ROWS=base,A1
  EXPLAIN=${TABLE3_DEVICE_EXPLAIN:-E}
fi

# shellcheck source=experiments/device_env.sh
. experiments/device_env.sh
device_python "$WORK" || exit 1
device_wheels "$WORK" || exit 1
# Every process's share of the GPU, both sweeps together (parallel_env keeps a value set here).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-$(
  awk -v n=$(( PAR_ROWS + PAR_EXPLAIN )) 'BEGIN { printf "%.3f", 0.9 / n }')}
say "mode $MODE, budget ${BUDGET} s, python $PY, root $ROOT, mirror $MIRROR," \
  "${PAR_ROWS} + ${PAR_EXPLAIN} runs at once, each ${XLA_PYTHON_CLIENT_MEM_FRACTION} of the memory"
STAMP=$WORK/started
touch "$STAMP"

set -m  # each sweep in a process group of its own, so that the budget stops its runs too
"$PY" -m experiments.table3 "${COMMON[@]}" "--rows=$ROWS" "--parallel=$PAR_ROWS" \
  "--out=$WORK/out_rows" >"$WORK/rows.log" 2>&1 </dev/null &
ROWS_PID=$!
"$PY" -m experiments.table3 "${COMMON[@]}" "--explain=$EXPLAIN" "--parallel=$PAR_EXPLAIN" \
  "--out=$WORK/out_explain" >"$WORK/explain.log" 2>&1 </dev/null &
EXPLAIN_PID=$!
set +m

SEEN_ROWS=0 SEEN_EXPLAIN=0
progress() {  # each run's line as the sweeps print it ("C1024 seed 1: ppl 7.30 bleu ..."), once
  local lines
  mapfile -t lines < <(grep ' seed [0-9]*: ppl ' "$WORK/rows.log" 2>/dev/null)
  for line in "${lines[@]:SEEN_ROWS}"; do say "$line"; done
  SEEN_ROWS=${#lines[@]}
  mapfile -t lines < <(grep ' seed [0-9]*: ppl ' "$WORK/explain.log" 2>/dev/null)
  for line in "${lines[@]:SEEN_EXPLAIN}"; do say "$line"; done
  SEEN_EXPLAIN=${#lines[@]}
}
while kill -0 "$ROWS_PID" 2>/dev/null || kill -0 "$EXPLAIN_PID" 2>/dev/null; do
  if (( SECONDS - START >= BUDGET - 20 )); then  # 20 s: the kill, the tarball
    say "budget: stopping the sweeps (runs still training are lost)"
    kill -TERM -- "-$ROWS_PID" "-$EXPLAIN_PID" 2>/dev/null
    sleep 3
    kill -KILL -- "-$ROWS_PID" "-$EXPLAIN_PID" 2>/dev/null
    break
  fi
  sleep 2
  progress
done
progress
rc=0
wait "$ROWS_PID" || rc=1
wait "$EXPLAIN_PID" || rc=1

# Where the unfinished runs got to (a run cut off by the budget says how far it was)
while IFS= read -r runlog; do
  dir=$(dirname "$runlog")
  [[ -f $dir/result.json ]] && continue
  last=$(grep -o 'step [0-9]*/[0-9]*' "$runlog" | tail -n 1)
  say "unfinished: ${dir#"$ROOT"/}, ${last:+at }${last:-before its first logged step}"
done < <(find "$ROOT" -name log.txt -path '*seed*' 2>/dev/null | sort)

# What this call finished: the mirror's result.json files written since the sweeps started.
# Staged in a folder of their own, so that the tarball is valid with none of them too.
mkdir -p "$MIRROR"
(cd "$MIRROR" && find . -name result.json -newer "$STAMP" | sort) >"$WORK/finished.txt"
rm -rf "$WORK/results" && mkdir -p "$WORK/results"
(cd "$MIRROR" && xargs -r cp --parents -t "$WORK/results" <"$WORK/finished.txt")
tar -czf "$WORK/results.tgz" -C "$WORK/results" .
say "finished $(wc -l <"$WORK/finished.txt") run(s) in $WORK/results.tgz; sweeps' exit: $rc" \
  "(their last lines: $(tail -n 1 "$WORK/rows.log" | cut -c1-200) | $(tail -n 1 "$WORK/explain.log" | cut -c1-200))"
exit "$rc"
