#!/usr/bin/env bash
# Code search (docstring -> function code; shared/data/code): all-MiniLM-L6-v2 fine-tuned with
# MultipleNegativesRankingLoss per batch arm x SEEDS seeds, scored on EVAL (CodeSearchNet's
# 1,000-candidate MRR, MRR@10, NDCG@10, R@1, per package). Its defaults are the confirmation
# pre-registered in docs/results/code_search.md (seeds 1-5, the test split, -> results/
# code_search/confirm); the pilot wave was SEEDS=0 EVAL=valid OUT=results/code_search/pilots/wave1. Seed by seed, every
# arm of a seed before the next seed, so the paired comparison grows a seed at a time.
# Resumable: every run writes one JSON under $OUT and finished runs are skipped; WORKERS parallel
# workers walk the same list (a per-run lock keeps them off each other's runs). The mined
# negatives and the starting model's query embeddings are computed once and cached
# ($HARDBATCH_CACHE/codesearch); every run still charges their cost in its JSON.
#
#   scripts/codesearch_grid.sh                          # the grid, 1 worker
#   WORKERS=2 nohup scripts/codesearch_grid.sh > results/code_search/grid.log 2>&1 &
#   ARMS="default gcbs" SEEDS="0 1" scripts/codesearch_grid.sh
#
# Sizing (docs/results/code_search.md, wave 1 on the 2-core machine): STEPS 150 at B 64, code
# limit 128 tokens, embeddings + 4 lowest layers frozen: 16-30 min per run with one thread and
# two runs side by side (mining, once and cached: 28 min), 9 arms x 5 seeds in about 8 hours
# with 2 workers.
#
# Env: OUT (results/code_search/confirm), WORKERS (1), SEEDS ("1 2 3 4 5"), ARMS (default mined
#      gcbs knn proximity cluster community uniform community+mined: the arms (a)-(i)
#      pre-registered in docs/results/code_search.md),
#      STEPS (150), EPOCHS (instead of STEPS: e.g. 1 for one full epoch), SEQ (128: code
#      tokens), FREEZE (4),
#      TRAIN_LIMIT (all pairs), EVAL (test), DATA_DIR (default: $HARDBATCH_DATA or
#      ../shared/data), EXTRA (more args, e.g. "--refresh model").
# Exits 1 while runs are missing (failed, or held by another live process) at its end.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/code_search/confirm}
WORKERS=${WORKERS:-1}
read -r -a SEED_LIST <<< "${SEEDS:-1 2 3 4 5}"
read -r -a ARM_LIST <<< "${ARMS:-default mined gcbs knn proximity cluster community uniform community+mined}"
if [[ -n "${EPOCHS:-}" ]]; then SIZE=(--epochs "$EPOCHS"); else SIZE=(--steps "${STEPS:-150}"); fi
ARGS=("${SIZE[@]}" --max-seq-length "${SEQ:-128}" --freeze-layers "${FREEZE:-4}"
      --eval-split "${EVAL:-test}" --threads 1 --out "$OUT")
[[ -n "${TRAIN_LIMIT:-}" ]] && ARGS+=(--train-limit "$TRAIN_LIMIT")
[[ -n "${DATA_DIR:-}" ]] && ARGS+=(--data-dir "$DATA_DIR")
mkdir -p "$OUT"

worker() {
  local rc=0 seed arms
  arms=$(IFS=,; echo "${ARM_LIST[*]}")
  for seed in "${SEED_LIST[@]}"; do
    echo "[codesearch_grid] $(date -u +%H:%M:%S) seed $seed: $arms"
    python -m hardbatch bench codesearch --arm "$arms" --seed-list "$seed" "${ARGS[@]}" \
      ${EXTRA:-} || rc=1
  done
  return $rc
}

# shellcheck source=scripts/_workers.sh
source scripts/_workers.sh
status=0
run_workers "$WORKERS" || status=1
echo "[codesearch_grid] $(date -u +%H:%M:%S) done (exit $status)"
exit $status
