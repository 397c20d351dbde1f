#!/usr/bin/env bash
# Issue 18, confirmation: GraphCL + InfoNCE, uniform vs the configuration pre-registered in
# results/graphs/preregistration.json ("chosen": its "flags"), six TU datasets, seeds 0-9.
# Order: seed-major (seed 0 of both arms on every dataset, then seed 1, ...), small datasets
# first, so partial results are complete pairs. Resumable (one JSON per run under $OUT,
# finished runs skipped); WORKERS workers walk the same list, a per-run lock keeps them apart.
# Every run of both arms is computed here by the same code (the uniform runs of the earlier
# grid under results/graphs/ are not reused: see docs/results/graphs.md).
#
#   WORKERS=2 nohup scripts/graph_confirm.sh > results/graphs/confirm.log 2>&1 &
#   python scripts/report_graphs.py --in-place          # the page, also from partial results
#
# Env: DATA_DIR, OUT (results/graphs/confirm), WORKERS (2), SEEDS ("0 1 ... 9"),
#      ONLY (dataset subset), CHOSEN (override the flags: testing only).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/graphs/confirm}
WORKERS=${WORKERS:-2}
SEEDS=${SEEDS:-0 1 2 3 4 5 6 7 8 9}
DATA_ARGS=()
[[ -n "${DATA_DIR:-}" ]] && DATA_ARGS=(--data-dir "$DATA_DIR")
DATASETS=(MUTAG PROTEINS IMDB-BINARY NCI1 REDDIT-BINARY COLLAB)  # by run time
[[ -n "${ONLY:-}" ]] && read -r -a DATASETS <<< "$ONLY"
if [[ -z "${CHOSEN:-}" ]]; then
  CHOSEN=$(python -c 'import json; c = json.load(open("results/graphs/preregistration.json"))["chosen"]; print(c["flags"] if c else "")')
fi
if [[ -z "$CHOSEN" ]]; then
  echo "no configuration chosen yet in results/graphs/preregistration.json (run the exploration and the selection first)" >&2
  exit 2
fi
echo "[confirm] chosen configuration: $CHOSEN"
mkdir -p "$OUT"

worker() {
  local rc=0 seed ds
  for seed in $SEEDS; do
    for ds in "${DATASETS[@]}"; do
      # shellcheck disable=SC2086
      python -m hardbatch bench graphcl --dataset "$ds" --sampler uniform,proximity \
        --loss infonce --seed-list "$seed" --threads 1 --out "$OUT" "${DATA_ARGS[@]}" \
        $CHOSEN || rc=1
    done
  done
  return $rc
}

# shellcheck source=scripts/_workers.sh
source scripts/_workers.sh
status=0
run_workers "$WORKERS" || status=1
python scripts/report_graphs.py --in-place || true
exit $status
