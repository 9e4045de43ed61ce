#!/usr/bin/env bash
# The main job end to end on one CPU box: train the small config on Multi30k EN->DE, average the
# last checkpoints (§6.1), evaluate on test_2016_flickr and print the test BLEU.
# Usage: bash experiments/quickstart.sh [WORKDIR] [--config.key=value ...]
# It runs from the checkout's root, so a relative WORKDIR or path override is relative to it
# (as configs/small.py's data.dir is); the saved config.json records both forms (cfg.paths).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKDIR=${1:-runs/small}
shift || true

python -m tfm_jax train --config=configs/small.py --workdir="$WORKDIR" "$@"
python -m tfm_jax average --workdir="$WORKDIR"
python -m tfm_jax plot --workdir="$WORKDIR"
python -m tfm_jax evaluate --workdir="$WORKDIR" --split=test --checkpoint=averaged | tee "$WORKDIR/test_scores.log"
python - "$WORKDIR" <<'PY'
import json, sys
scores = json.loads(open(sys.argv[1] + "/test_scores.log").read().strip().splitlines()[-1])
print(f"test BLEU (sacreBLEU, detokenized): {scores['bleu']:.2f}   {scores['bleu_signature']}")
print(f"paper-style tokenized, compound-split BLEU: {scores['bleu_tok_compound']:.2f}")
PY
