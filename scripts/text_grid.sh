#!/usr/bin/env bash
# Unsupervised SimCSE (all-MiniLM-L6-v2, sentence-transformers) x {default, uniform, knn,
# proximity, gcbs} x {MNRL / InfoNCE at t 0.05, DCL / HCL at t 0.5} x 3 seeds, scored on STS12-16 +
# STS-B (docs/results/text.md). Priority order: the seed-0 comparison of the five samplers first,
# then seeds 1 and 2, then DCL / HCL. Resumable: every run writes one JSON under $OUT and finished
# runs are skipped, so the grid can be completed in pieces; one run at a time.
#
#   nohup scripts/text_grid.sh > results/text/grid.log 2>&1 &
#   N=32768 scripts/text_grid.sh          # ~1 hour of training per run at ~0.14 steps/s
#
# Env: OUT (results/text), N (training sentences, default 5120 = 80 steps at batch 64, about
#      9-17 min of training + 3-5 min of STS evaluation per run on this project's loaded 2-core
#      machine), DATA_DIR (default: $HARDBATCH_DATA or ../shared/data), START_EMB (precomputed
#      starting-model embeddings, default ~/.cache/hardbatch/wiki100000_minilm.npy when it
#      exists), EXTRA (more args).
# At its end the script refreshes docs/results/text.md (report --in-place) and exits 1 when a
# run is missing (failed, or held by another live process).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/text}
N=${N:-5120}
ARGS=(--num-sentences "$N" --out "$OUT" --threads 1)
[[ -n "${DATA_DIR:-}" ]] && ARGS+=(--data-dir "$DATA_DIR")
START_EMB=${START_EMB:-$HOME/.cache/hardbatch/wiki100000_minilm.npy}
[[ -f "$START_EMB" ]] && ARGS+=(--start-embeddings "$START_EMB")
mkdir -p "$OUT"

status=0
run() {  # sampler loss seed
  echo "[text_grid] $(date -u +%H:%M:%S) $1 $2 seed $3"
  python -m hardbatch bench simcse --sampler "$1" --loss "$2" --seed-list "$3" "${ARGS[@]}" \
    ${EXTRA:-} || status=1
}

[[ -f "$OUT/zero_shot__all-MiniLM-L6-v2.json" ]] || \
  python -m hardbatch eval sts --model all-MiniLM-L6-v2 --threads 1 \
    --out "$OUT/zero_shot__all-MiniLM-L6-v2.json" ${DATA_DIR:+--data-dir "$DATA_DIR/sts"}

for seed in 0 1 2; do
  run default mnrl "$seed"
  for s in proximity gcbs uniform knn; do run "$s" infonce "$seed"; done
done
# DCL / HCL at SimCSE's t = 0.05 sit on their debiasing floor on every row and train nothing
# (scripts/text_debias_floor.py; docs/losses.md): two runs each show it. Their sampler comparison
# runs at t = 0.5 (the DCL / HCL papers' temperature), next to MNRL at the same temperature.
for loss in dcl hcl; do
  for s in default proximity; do run "$s" "$loss" 0; done
done
for seed in 0 1 2; do
  for loss in dcl hcl; do
    for s in default proximity gcbs uniform knn; do
      EXTRA="--temperature 0.5 ${EXTRA:-}" run "$s" "$loss" "$seed"
    done
  done
  EXTRA="--temperature 0.5 ${EXTRA:-}" run default mnrl "$seed"
done
python scripts/report_text.py --results "$OUT" --in-place || true
echo "[text_grid] $(date -u +%H:%M:%S) done (exit $status)"
exit $status
