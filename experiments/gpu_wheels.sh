#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI) before experiments/gpu_check.sh goes to a GPU machine
# that reaches nothing. It stages, gitignored, what the device image lacks:
#
#   experiments/wheels/          ml_collections, sacremoses and tensorboardX, at constraints.txt's
#                                versions (pure-Python wheels). What they need is on the image
#                                already (absl-py, PyYAML; regex, click, joblib, tqdm; numpy,
#                                packaging, protobuf), so they come without their dependencies.
#   experiments/data/multi30k/   a copy of ../shared/data/multi30k (4 MB), the quickstart's
#                                corpus: ../shared stays behind when the working tree travels.
#
# Then carry both: run(carry=["experiments/wheels", "experiments/data"], ...); gpu_check.sh's
# header has the whole command. Usage: bash experiments/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS=experiments/wheels
DEVICE_PYTHON=3.12  # the device image's python3 (/work/.library/device/KINDS.md)

pins=()
for name in ml_collections sacremoses tensorboardX; do
  pin=$(grep -i "^${name}==" constraints.txt) || { echo "no $name in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf "$WHEELS" && mkdir -p "$WHEELS"  # one version of each: two would stop the install there
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON" \
  -d "$WHEELS" "${pins[@]}"
ls -l "$WHEELS"

DATA=../shared/data/multi30k
if [[ -f $DATA/train.en ]]; then
  rm -rf experiments/data/multi30k && mkdir -p experiments/data
  cp -r "$DATA" experiments/data/multi30k
  chmod -R u+w experiments/data/multi30k  # shared/ is read-only; the next run replaces the copy
  du -sh experiments/data/multi30k
else
  echo "no $DATA: the GPU check will skip the quickstart and decoding" >&2
fi
