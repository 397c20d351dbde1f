#!/usr/bin/env bash
# Confirmatory grid of the non-saturated SimCSE setting (docs/results/text.md, "Re-initialised
# MiniLM"): all-MiniLM-L6-v2 with its top L layers re-initialised (seeded), lower layers frozen
# and cached, top layers trained with unsupervised SimCSE (B 64, t 0.05) under each sampler;
# STS12-16 + STS-B and the STS-B retrieval view. The settings below were fixed from the pilots
# before any confirmatory run (the page's "Pre-registered choices").
#
#   WORKERS=2 nohup scripts/text_confirm.sh > results/text/reinit/grid.log 2>&1 &
#
# Resumable: one JSON per run under $OUT; finished runs are skipped and a per-run lock keeps the
# workers off each other's runs, so the script can be stopped and restarted at any time. The
# runs are ordered seed by seed (every arm of seed 1, then of seed 2, ...) so paired
# comparisons complete early; the optional arms (knn, proximity + guided masks) come after the
# five seeds of the first four. At the end: the starting model's STS for every seed (probe).
#
# Env: WORKERS (parallel processes, one torch thread each, default 1), OUT (results/text/reinit),
#      SEEDS ("1 2 3 4 5"), L (re-initialised layers), N (training sentences), STEPS, LR,
#      K (proximity neighbours), REFRESH (steps between re-encodings), MARGIN (guided mask),
#      ARMS (default "default uniform proximity gcbs"), EXTRA_ARMS ("knn guided"),
#      DATA_DIR, EXTRA (more args).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
OUT=${OUT:-results/text/reinit}
WORKERS=${WORKERS:-1}
SEEDS=${SEEDS:-"1 2 3 4 5"}
L=${L:-1}
N=${N:-20000}
STEPS=${STEPS:-1500}
LR=${LR:-5e-4}
K=${K:-10}
REFRESH=${REFRESH:-250}
MARGIN=${MARGIN:-0.5}
ARMS=${ARMS:-"default uniform proximity gcbs"}
EXTRA_ARMS=${EXTRA_ARMS:-"knn guided"}
COMMON=(--reinit-layers "$L" --num-sentences "$N" --max-steps "$STEPS" --lr "$LR"
        --refresh-every "$REFRESH" --loss mnrl --threads 1 --out "$OUT")
[[ -n "${DATA_DIR:-}" ]] && COMMON+=(--data-dir "$DATA_DIR")
mkdir -p "$OUT"

arm_args() {  # arm -> sampler arguments
  case "$1" in
    proximity) echo "--sampler proximity --neighbors $K --candidates 1000 --restart 0.7" ;;
    guided) echo "--sampler proximity --neighbors $K --candidates 1000 --restart 0.7 --guide-margin $MARGIN" ;;
    *) echo "--sampler $1" ;;
  esac
}

worker() {  # every worker walks the same list; locks and finished files split the work
  local status=0
  for arms in "$ARMS" "$EXTRA_ARMS"; do
    for seed in $SEEDS; do
      for arm in $arms; do
        echo "[text_confirm] w$1 $(date -u +%H:%M:%S) $arm seed $seed"
        # shellcheck disable=SC2046
        python -m hardbatch bench simcse $(arm_args "$arm") --seed-list "$seed" "${COMMON[@]}" \
          ${EXTRA:-} || status=1
      done
    done
  done
  return $status
}

# one lower-layer cache for everyone (stored under $HARDBATCH_CACHE) before the workers start
python - "$L" "$N" "${DATA_DIR:-}" <<'PY' || exit 1
import sys
from hardbatch_experiments.recipes.simcse.data import read_sentences
from hardbatch_experiments.recipes.simcse.partial_run import cached_lower
from hardbatch_experiments.sts import load_sentence_transformer
layers, n, data = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None
model = load_sentence_transformer("all-MiniLM-L6-v2")
print("[text_confirm] lower-layer cache:", cached_lower(model, read_sentences(data, n), layers, 32,
                                                     "all-MiniLM-L6-v2")[1], flush=True)
PY
pids=()
for w in $(seq 1 "$WORKERS"); do
  worker "$w" & pids+=($!)
  sleep 20
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
# the starting model of every seed (its STS, for the page's "vs start" column); skips done seeds
python -m hardbatch_experiments.recipes.simcse.probe start --layers "$L" --seeds "${SEEDS// /,}" \
  --num-sentences 2000 ${DATA_DIR:+--data-dir "$DATA_DIR"} || status=1
python scripts/report_text.py --in-place || true
echo "[text_confirm] $(date -u +%H:%M:%S) done (exit $status)"
exit $status
