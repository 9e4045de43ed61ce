#!/bin/bash
# Train tfm_jax on a Cloud TPU VM slice: copy this file, edit the variables, run it from your
# workstation (gcloud installed and logged in). Each step is one gcloud command; run them one
# at a time the first time (`bash configs/launch/tpu_vm.sh create`, then `install`, `train`).
#
# Every host of the slice runs the same `train` command (--worker=all). TFM_JAX_DISTRIBUTED=1
# makes each join the run through jax.distributed (on a TPU VM nothing in the environment says
# "pod"); the run's first lines, from process 0 alone, name the processes, devices and mesh.
# Preemption: a spot/preemptible TPU or a maintenance event sends SIGTERM; JAX's preemption
# service picks one step every host saves, and `train` exits 75. `train` below reruns the
# command on 75 while the VM lives; if the VM was taken, recreate it (`create`, `install`) and
# run `train` again: it resumes from WORKDIR. WORKDIR must be one every host reaches: a bucket.
set -euo pipefail

TPU_NAME=${TPU_NAME:-tfm-jax}
ZONE=${ZONE:-us-west4-a}
ACCELERATOR=${ACCELERATOR:-v5litepod-16}   # v5e-16 in `python -m tfm_jax compile --target`
VERSION=${VERSION:-v2-alpha-tpuv5-lite}
REPO_URL=${REPO_URL:-https://github.com/YOUR_ORG/tfm_jax.git}
CONFIG=${CONFIG:-configs/base.py}
WORKDIR=${WORKDIR:-gs://YOUR_BUCKET/runs/base}
ARGS=${ARGS:---config.model.dtype=bfloat16 --config.model.scan_layers=true --config.data.packing=true}

on_all() { gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" --worker=all --command="$1"; }
on_first() { gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" --worker=0 --command="$1"; }

case "${1:-}" in
  compile)  # on your workstation, before paying for the slice: does it fit? (README, compile)
    python -m tfm_jax compile --config="${CONFIG}" --target=v5e-16 ${ARGS} ;;
  create)
    gcloud compute tpus tpu-vm create "${TPU_NAME}" --zone="${ZONE}" \
        --accelerator-type="${ACCELERATOR}" --version="${VERSION}" --spot ;;
  install)  # the lock's TPU and gcs extras (libtpu; gcsfs for the bucket), as CI tests them
    on_all "git clone -q ${REPO_URL} tfm_jax 2>/dev/null || git -C tfm_jax pull -q; \
        cd tfm_jax && python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[tpu,gcs]'" ;;
  train)
    on_all "cd tfm_jax && while :; do TFM_JAX_DISTRIBUTED=1 .venv/bin/python -m tfm_jax train \
        --config=${CONFIG} --workdir=${WORKDIR} ${ARGS}; rc=\$?; [ \$rc -eq 75 ] || exit \$rc; done" ;;
  average)  # §6.1, then BLEU on newstest2014 (README, "Commands")
    on_first "cd tfm_jax && .venv/bin/python -m tfm_jax average --workdir=${WORKDIR} && \
        .venv/bin/python -m tfm_jax evaluate --workdir=${WORKDIR} --split=test --checkpoint=averaged" ;;
  delete)
    gcloud compute tpus tpu-vm delete "${TPU_NAME}" --zone="${ZONE}" --quiet ;;
  *)
    echo "usage: $0 compile|create|install|train|average|delete" >&2; exit 2 ;;
esac
