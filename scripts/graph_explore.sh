#!/usr/bin/env bash
# Issue 18, exploration: GraphCL + InfoNCE on IMDB-BINARY and PROTEINS, seeds 100-104, the
# uniform baseline and 12 proximity configurations (3 x 2 x 2):
#   sampler space   readout | projection | centred-readout
#   warm-up         0 | 2 uniform epochs
#   walk protocol   ours (linear alpha 0.2 -> 0.05, epochs of ceil(N/B) walks)
#                   | the authors' (alpha per epoch max(0.05, 0.2 - 0.02 e), coverage epochs)
# Resumable (one JSON per run under $OUT; finished runs are skipped); WORKERS workers walk
# the same list, a per-run lock keeps them apart. The uniform runs carry no option tag, so
# every configuration is paired with the same uniform run of its seed.
#
#   WORKERS=2 nohup scripts/graph_explore.sh > results/graphs/explore.log 2>&1 &
#   python scripts/report_graphs.py --explore results/graphs/explore   # the selection table
#
# Env: DATA_DIR, OUT (results/graphs/explore), WORKERS (2), SEEDS (100,101,102,103,104).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/graphs/explore}
WORKERS=${WORKERS:-2}
SEEDS=${SEEDS:-100,101,102,103,104}
DATA_ARGS=()
[[ -n "${DATA_DIR:-}" ]] && DATA_ARGS=(--data-dir "$DATA_DIR")
mkdir -p "$OUT"

CONFIGS=()
for walk in "" "--alpha-schedule per-epoch --epoch-mode coverage"; do
  for warm in 0 2; do
    for space in readout projection centred-readout; do
      CONFIGS+=("--sampler-space $space --warmup-epochs $warm $walk")
    done
  done
done

worker() {
  local rc=0 cfg
  for cfg in "${CONFIGS[@]}"; do
    # shellcheck disable=SC2086
    python -m hardbatch bench graphcl --dataset PROTEINS --dataset IMDB-BINARY \
      --sampler uniform,proximity --loss infonce --seed-list "$SEEDS" --threads 1 \
      --out "$OUT" "${DATA_ARGS[@]}" $cfg || rc=1
  done
  return $rc
}

# shellcheck source=scripts/_workers.sh
source scripts/_workers.sh
status=0
run_workers "$WORKERS" || status=1
python scripts/report_graphs.py --explore "$OUT" || true
exit $status
