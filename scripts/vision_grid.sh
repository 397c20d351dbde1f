#!/usr/bin/env bash
# SimCLR grid on CIFAR-10 (issue 7), in priority order, resumable: every run writes one JSON under
# $OUT and finished runs are skipped (a per-run lock keeps a second copy of the grid off a running
# run; a killed run resumes from its per-epoch checkpoint). This is the earlier B = 256 record
# of docs/results/vision.md; the batch-size sweep (issue 21) is scripts/vision_sweep.sh.
#
#   nohup scripts/vision_grid.sh > results/vision/grid.log 2>&1 &
#   DATASET=mnist scripts/vision_grid.sh
#   EXTRA="--train-size 0 --epochs 14" scripts/vision_grid.sh     # the ~1 hour / run setting
#
# Env: DATASET (cifar10), DATA_DIR (default: $HARDBATCH_DATA or ../shared/data),
#      OUT (results/vision), EXTRA (more arguments for every run).
# After every run the script refreshes docs/results/vision.md (report --in-place); it exits 1
# when a run is missing (failed, or held by another live process) at its end.
set -uo pipefail
cd "$(dirname "$0")/.."
DATASET=${DATASET:-cifar10}
OUT=${OUT:-results/vision}
DATA_ARGS=()
[[ -n "${DATA_DIR:-}" ]] && DATA_ARGS=(--data-dir "$DATA_DIR")
mkdir -p "$OUT"

status=0
run() {  # sampler loss seed
  python -m hardbatch bench simclr --dataset "$DATASET" --sampler "$1" --loss "$2" \
    --seed-list "$3" --out "$OUT" --threads 1 "${DATA_ARGS[@]}" ${EXTRA:-} || status=1
  python scripts/report_vision.py --results "$OUT" --in-place > /dev/null 2>&1 || true
}

MAIN=("uniform infonce" "proximity infonce" "uniform sscl" "knn infonce" "gcbs infonce")
# dcl / hcl: runs finished under their former names (debiased / hard_negative) count as done
OTHER=("proximity sscl" "uniform dcl" "uniform hcl" "proximity dcl" "proximity hcl")
for seed in 0 1 2; do
  for row in "${MAIN[@]}"; do run $row $seed; done
done
for seed in 0 1 2; do
  for row in "${OTHER[@]}"; do run $row $seed; done
done
exit $status
