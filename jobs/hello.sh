#!/usr/bin/env bash
# A shell job with arguments: prints what it was given and where it runs, then works a while.
#   iadeep queue add jobs/hello.sh "first arg" second --gpus 1 --env GREETING=hi
# iadeep sets CUDA_VISIBLE_DEVICES to the GPUs it assigned, and IADEEP_JOB_ID.
set -euo pipefail
echo "job ${IADEEP_JOB_ID:-?} on $(hostname), GPUs ${CUDA_VISIBLE_DEVICES:-none}"
i=0
for arg in "$@"; do
    i=$((i + 1))
    printf 'arg %d: %s\n' "$i" "$arg"
done
echo "GREETING=${GREETING:-unset}"
sleep "${SLEEP_S:-5}"
echo done
