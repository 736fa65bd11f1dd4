#!/usr/bin/env bash
# A job that reports progress without Python: one line "<unix_time> <iterations_done>" per step
# appended to $IADEEP_PROGRESS_FILE lets iadeep measure how fast it really runs while sharing.
#   iadeep queue add jobs/steps_progress.sh 100 0.1 --workload mlp
# Arguments: STEPS (default 50), SECONDS_PER_STEP (default 0.2).
set -euo pipefail
steps=${1:-50}
pause=${2:-0.2}
for ((step = 1; step <= steps; step++)); do
    sleep "$pause"          # stand-in for one training iteration
    if [ -n "${IADEEP_PROGRESS_FILE:-}" ]; then
        echo "$(date +%s.%N) $step" >> "$IADEEP_PROGRESS_FILE"
    fi
done
echo "finished $steps steps"
