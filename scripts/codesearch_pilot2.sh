#!/usr/bin/env bash
# Code search, pilot wave 2 (issue 43, item 1; docs/results/code_search.md): on the valid split,
# seed 0, the same protocol as wave 1 (150 steps, B 64, code 128 tokens, 4 layers frozen), pick
#   - the hardness strength of sentence-transformers' MultipleNegativesRankingLoss(hardness_mode=)
#     for default batches (arm `hardness`: in_batch_negatives) and for the mined triplets (arm
#     `mined+hardness`: all_negatives), from STRENGTHS;
#   - the authors' B3 configuration against hardbatch's: community and community+mined with
#     --community-config authors, and hardbatch's community+mined on seed 0 (wave 1 has its
#     community alone), run by the first loop once its strengths are done.
# Two loops side by side (one per arm family, one thread each), strengths in the order given so
# that the grid's range is covered first; resumable: finished runs are skipped.
#
#   nohup scripts/codesearch_pilot2.sh > results/code_search/pilots/wave2.log 2>&1 &
#
# Env: STRENGTHS ("3 10 1 5"), OUT (results/code_search/pilots/wave2), B3 (1: run the B3
#      comparison; 0: skip it).
set -uo pipefail
cd "$(dirname "$0")/.."
read -r -a STRENGTH_LIST <<< "${STRENGTHS:-3 10 1 5}"
export OUT=${OUT:-results/code_search/pilots/wave2} SEEDS=0 EVAL=valid WORKERS=1
loop() {  # loop ARM: every strength of ARM, one after another
  local s rc=0
  for s in "${STRENGTH_LIST[@]}"; do
    ARMS="$1" EXTRA="--hardness-strength $s" bash scripts/codesearch_grid.sh || rc=1
  done
  return $rc
}
status=0
(loop hardness 2>&1 | sed -u "s/^/[pairs] /"
 if [[ "${B3:-1}" == 1 ]]; then
   ARMS="community+mined" bash scripts/codesearch_grid.sh 2>&1 | sed -u "s/^/[b3] /"
   ARMS="community community+mined" EXTRA="--community-config authors" \
     bash scripts/codesearch_grid.sh 2>&1 | sed -u "s/^/[b3] /"
 fi) &
a=$!
sleep 5
loop mined+hardness 2>&1 | sed -u "s/^/[triplets] /" || status=1
wait "$a" || status=1
echo "[codesearch_pilot2] $(date -u +%H:%M:%S) done (exit $status)"
exit $status
