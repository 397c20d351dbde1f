#!/usr/bin/env bash
# GraphCL x {uniform, knn, proximity, gcbs} x {InfoNCE, DCL, HCL} on six TU datasets
# (BatchSampler paper, Table 3), in priority order, resumable: every run writes one JSON under
# $OUT and finished runs are skipped, so the grid can be completed in pieces. WORKERS parallel
# workers walk the same list (a per-run lock file keeps them off each other's runs).
#
#   scripts/graph_grid.sh                 # everything, 1 worker
#   WORKERS=2 scripts/graph_grid.sh       # 2 workers (1 torch thread each)
#   ONLY="MUTAG PROTEINS" STAGE=infonce scripts/graph_grid.sh
#   nohup scripts/graph_grid.sh > results/graphs/grid.log 2>&1 &
#
# Env: DATA_DIR (default: $HARDBATCH_DATA or ../shared/data), OUT (results/graphs),
#      WORKERS (1), ONLY (dataset subset), STAGE (all | infonce | debiased), EXTRA (more args).
# Each command prints its progress and a summary line; the script refreshes
# docs/results/graphs.md (report --in-place) and exits 1 while runs are missing (failed, or
# held by another live process) at its end.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/graphs}
WORKERS=${WORKERS:-1}
STAGE=${STAGE:-all}
DATA_ARGS=()
[[ -n "${DATA_DIR:-}" ]] && DATA_ARGS=(--data-dir "$DATA_DIR")
# small datasets first (by expected run time)
DATASETS=(MUTAG PROTEINS IMDB-BINARY NCI1 REDDIT-BINARY COLLAB)
[[ -n "${ONLY:-}" ]] && read -r -a DATASETS <<< "$ONLY"
mkdir -p "$OUT"

run() {  # dataset loss seeds
  python -m hardbatch bench graphcl --dataset "$1" --sampler all --loss "$2" --seeds "$3" \
    --out "$OUT" "${DATA_ARGS[@]}" ${EXTRA:-}
}

worker() {
  local rc=0
  if [[ "$STAGE" == all || "$STAGE" == infonce ]]; then
    for ds in "${DATASETS[@]}"; do run "$ds" infonce 5 || rc=1; done
  fi
  if [[ "$STAGE" == all || "$STAGE" == debiased ]]; then
    for ds in "${DATASETS[@]}"; do run "$ds" dcl,hcl 3 || rc=1; done
  fi
  return $rc
}

# shellcheck source=scripts/_workers.sh
source scripts/_workers.sh
status=0
run_workers "$WORKERS" || status=1
python scripts/report_graphs.py --results "$OUT" --in-place || true
exit $status
