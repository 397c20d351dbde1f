#!/usr/bin/env bash
# SimCLR CIFAR-10 batch-size sweep (issue 21; docs/results/vision.md, "Batch-size sweep"):
# B = 32, 64, 128, 256 x {uniform, proximity (RWR 0.2 -> 0.05)} x {InfoNCE, SSCL} x seeds, the
# same number of training images seen at every B (steps = IMAGES / B), Adam lr scaled by
# sqrt(B / 256) from 1e-3; plus the equal-steps view (B = 64 at the step count of B = 256, i.e.
# IMAGES / 4 images). Batch diagnostics are measured in one fixed reference encoder shared by
# every arm, seed and B: the projections of a uniform + InfoNCE run at B = 256 with seed 100 (no
# sweep seed), built first ($REF). Resumable: every run writes one JSON under $OUT, finished runs
# are skipped, a killed run resumes from its per-epoch checkpoint; WORKERS workers walk the same
# list (a per-run lock keeps them off each other's runs). Order: seed 0 complete (every B and
# arm, then its equal-steps runs), then seed 1, ... so that complete pairs appear early.
#
#   nohup scripts/vision_sweep.sh > results/vision/sweep.log 2>&1 &
#   WORKERS=2 scripts/vision_sweep.sh                        # two workers
#   DRY=1 scripts/vision_sweep.sh                            # list the commands only
#
# Env: OUT (results/vision/sweep), SEEDS ("0 1 2"), MORE_SEEDS ("3 4": the primary comparison,
#      uniform vs proximity with InfoNCE, at every B, after SEEDS; "" for none), WORKERS (1),
#      GUIDED_BATCHES ("64 32"),
#      MARGIN (guided arm; default: the chosen margin), TRAIN (8192 training images, a
#      multiple of every B), IMAGES (81920 = 10 epochs of TRAIN), DATA_DIR, EXTRA (more
#      arguments for every run), DRY (print the commands, run nothing).
# After every run the script refreshes docs/results/vision.md (report --in-place); it exits 1
# when a run is missing (failed, or held by another live process) at its end.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/vision/sweep}
SEEDS=${SEEDS:-0 1 2}
MORE_SEEDS=${MORE_SEEDS-3 4}
WORKERS=${WORKERS:-1}
TRAIN=${TRAIN:-8192}
IMAGES=${IMAGES:-81920}
REF=${REF:-$OUT/reference/reference_uniform_infonce_b256_seed100.pt}
ARMS=("uniform infonce" "proximity infonce" "uniform sscl" "proximity sscl")
BATCHES=(256 128 64 32)
# guided arm: proximity + InfoNCE with guided false-negative masks (the reference encoder as
# guide), at the small batch sizes only; its margin was chosen before any guided run by
# scripts/vision_guide_margin.py (results/vision/sweep/guide_margin.json)
GUIDED_BATCHES=(${GUIDED_BATCHES:-64 32})
MARGIN=${MARGIN:-$(python -c 'import json; print(json.load(open("results/vision/sweep/guide_margin.json"))["chosen_margin"])' 2>/dev/null)}
COMMON=(--dataset cifar10 --train-size "$TRAIN" --lr 1e-3 --lr-rule sqrt --lr-reference-batch 256
        --temperature 0.5 --threads 1)
[[ -n "${DATA_DIR:-}" ]] && COMMON+=(--data-dir "$DATA_DIR")
mkdir -p "$OUT"

bench() {  # arguments of hardbatch bench simclr
  echo "[vision_sweep] $(date -u +%H:%M:%S) hardbatch bench simclr $*"
  [[ -n "${DRY:-}" ]] && return 0
  python -m hardbatch bench simclr "$@" ${EXTRA:-}
}

_results() { find "$OUT" -maxdepth 1 -name '*.json' | wc -l; }

run() {  # sampler loss seed batch images [more arguments]
  local before; before=$(_results)
  # the proximity graph is rebuilt once per epoch of the training subset (TRAIN / B steps)
  # kNN evaluation before training, every 5 epochs (half-way) and at the end (+ linear probe)
  bench "${COMMON[@]}" --sampler "$1" --loss "$2" --seed-list "$3" --batch-size "$4" \
    --images "$5" --refresh-every $((TRAIN / $4)) --eval-every $((5 * TRAIN / $4)) \
    --reference "$REF" --out "$OUT" "${@:6}"
  local rc=$?
  # refresh the page only when a run finished (a skipped run adds no JSON)
  [[ -z "${DRY:-}" && $(_results) != "$before" ]] && {
    python scripts/report_vision.py --in-place > /dev/null 2>&1 || true; }
  return $rc
}

# the fixed reference encoder (one run, before any worker starts)
if [[ ! -f "$REF" ]]; then
  bench "${COMMON[@]}" --sampler uniform --loss infonce --seed-list 100 --batch-size 256 \
    --images "$IMAGES" --refresh-every $((TRAIN / 256)) --eval-every $((5 * TRAIN / 256)) \
    --save-reference "$REF" \
    --out "$OUT/reference" --force || { echo "[vision_sweep] reference run failed"; exit 1; }
fi

worker() {
  local rc=0
  for seed in $SEEDS; do
    for b in "${BATCHES[@]}"; do
      for arm in "${ARMS[@]}"; do run $arm "$seed" "$b" "$IMAGES" || rc=1; done
    done
    # equal steps: B = 64 at B = 256's step count (IMAGES / 4 images), vs the B = 256 runs above
    for arm in "${ARMS[@]}"; do run $arm "$seed" 64 $((IMAGES / 4)) || rc=1; done
    if [[ -n "$MARGIN" ]]; then
      for b in "${GUIDED_BATCHES[@]}"; do
        run proximity infonce "$seed" "$b" "$IMAGES" --guide "$REF" --guide-margin "$MARGIN" || rc=1
      done
    fi
  done
  # seeds 3 and 4 of the primary comparison (uniform vs proximity, InfoNCE) at every B
  for seed in $MORE_SEEDS; do
    for b in "${BATCHES[@]}"; do
      for arm in "uniform infonce" "proximity infonce"; do run $arm "$seed" "$b" "$IMAGES" || rc=1; done
    done
  done
  return $rc
}

# shellcheck source=scripts/_workers.sh
source scripts/_workers.sh
status=0
run_workers "$WORKERS" || status=1
[[ -z "${DRY:-}" ]] && { python scripts/report_vision.py --in-place || true; }
echo "[vision_sweep] $(date -u +%H:%M:%S) done (exit $status)"
exit $status
