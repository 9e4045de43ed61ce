#!/usr/bin/env bash
# Compile time of the base and big train steps for h200x8 and v5e-16, from this CPU host, by
# variant: what model.scan_layers, bf16 and fewer distinct shapes (data.packing) buy.
# Usage: bash experiments/compile_time.sh OUT.jsonl   (one `compile --json` record a line, each
# with "variant"; run it with nothing else on the machine: compile time is CPU time)
# Needs: pip install -c constraints.txt -e '.[tpu,cuda12-compile]'
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash experiments/compile_time.sh OUT.jsonl}
one="--shapes=192x128x128"  # one train shape (and the eval step at it): variants side by side
run() {  # variant config target args...
    local variant=$1 config=$2 target=$3
    shift 3
    if grep -q "\"variant\": \"$variant\", \"config\": \"$config\", \"target\": \"$target\"" "$out" 2>/dev/null; then
        return  # resumable: done already
    fi
    echo "$(date +%T) $variant $config $target" >&2
    JAX_PLATFORMS=cpu python -m tfm_jax compile --config="$config" --target="$target" --json "$@" \
        2>/dev/null | tail -1 | python -c "import json,sys; r=json.load(sys.stdin); \
print(json.dumps({'variant': '$variant', 'config': '$config', 'target': '$target', **r}))" >> "$out"
}
for target in h200x8 v5e-16; do
    for config in configs/base.py configs/big.py; do
        run f32_unrolled_1shape "$config" "$target" "$one"
        run bf16_unrolled_1shape "$config" "$target" "$one" --config.model.dtype=bfloat16
        run bf16_scan_1shape "$config" "$target" "$one" --config.model.dtype=bfloat16 \
            --config.model.scan_layers=true
        # everything a run compiles, from the config's shapes
        run bf16_scan_packed_all "$config" "$target" --config.model.dtype=bfloat16 \
            --config.model.scan_layers=true --config.data.packing=true
        run bf16_scan_buckets_all "$config" "$target" --config.model.dtype=bfloat16 \
            --config.model.scan_layers=true
    done
done
