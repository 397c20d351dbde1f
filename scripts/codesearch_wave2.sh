#!/usr/bin/env bash
# Code search, wave 2 (issue 43, items 2 and 3; pre-registered in docs/results/code_search.md,
# "Wave 2"): the confirmation on the test split, seeds 1-5, and the full epoch, seeds 1-3, with
# the configurations the pilot (scripts/codesearch_pilot2.sh) chose. The choice is passed in,
# never computed here, so that it is written on the page before these runs start:
#
#   S_IB=3 S_ALL=5 B3=hardbatch WORKERS=2 nohup scripts/codesearch_wave2.sh \
#     > results/code_search/wave2.log 2>&1 &
#
# Env (required): S_IB (the hardness strength of `hardness`, in_batch_negatives), S_ALL (of the
#      mined arms, all_negatives), B3 (hardbatch | authors: the community configuration that
#      won over the mined triplets).
# Env (optional): HARDBATCH_CACHE (results/code_search/cache), STAGES ("confirm epoch"),
#      WORKERS (2), CONFIRM_SEEDS ("1 2 3 4 5"), EPOCH_SEEDS ("1 2 3"), CONFIRM_OUT (results/code_search/confirm: beside wave 1's runs,
#      whose default, mined and community+mined are the bases), EPOCH_OUT
#      (results/code_search/epoch), EPOCH_ARMS (extra arms of the full epoch, e.g. the best new
#      arm if it beat both at 150 steps).
# Resumable (one JSON per run; finished runs are skipped). Exits 1 while runs are missing.
set -uo pipefail
cd "$(dirname "$0")/.."
for v in S_IB S_ALL B3; do
  [[ -n "${!v:-}" ]] || { echo "codesearch_wave2.sh: set $v (the pilot's choice, written on the page first)" >&2; exit 2; }
done
[[ "$B3" == hardbatch || "$B3" == authors ]] || { echo "codesearch_wave2.sh: B3 must be hardbatch or authors, not '$B3'" >&2; exit 2; }
export WORKERS=${WORKERS:-2}
# the mined negatives' cache is committed (results/code_search/cache, .gitignore says what is
# kept): a fresh machine skips the 28-minute mining; every run still charges its recorded cost
export HARDBATCH_CACHE=${HARDBATCH_CACHE:-results/code_search/cache}
community=(--community-config "$B3")
status=0
grid() {  # grid OUT SEEDS EVAL ARMS EXTRA... : one call of the resumable grid
  local out=$1 seeds=$2 arms=$3; shift 3
  OUT=$out SEEDS=$seeds EVAL=test ARMS=$arms EXTRA="$*" bash scripts/codesearch_grid.sh || status=1
}
for stage in ${STAGES:-confirm epoch}; do
  case $stage in
    confirm)
      out=${CONFIRM_OUT:-results/code_search/confirm} seeds=${CONFIRM_SEEDS:-1 2 3 4 5}
      grid "$out" "$seeds" "hardness" --hardness-strength "$S_IB"                       # (j)
      grid "$out" "$seeds" "mined+hardness community+mined+hardness" \
        --hardness-strength "$S_ALL" "${community[@]}"                                  # (k), (l)
      grid "$out" "$seeds" "cluster+mined"                                              # (m)
      [[ "$B3" == authors ]] && grid "$out" "$seeds" "community+mined" "${community[@]}"  # (n)
      ;;
    epoch)
      out=${EPOCH_OUT:-results/code_search/epoch} seeds=${EPOCH_SEEDS:-1 2 3}
      # --hardness-strength per mode, so that an extra +hardness arm (EPOCH_ARMS) runs at the
      # pilot's strength, not the command's default; arms without +hardness ignore it
      EPOCHS=1 grid "$out" "$seeds" "mined community+mined ${EPOCH_ARMS:-}" \
        --hardness-strength "ib=$S_IB,all=$S_ALL" "${community[@]}"
      ;;
    *) echo "codesearch_wave2.sh: unknown stage '$stage' (confirm, epoch)" >&2; exit 2 ;;
  esac
done
echo "[codesearch_wave2] $(date -u +%H:%M:%S) done (exit $status)"
exit $status
