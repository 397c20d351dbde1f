#!/usr/bin/env bash
# The code-search evidence at the scale users train, on a GPU (issue 46, item 5):
# all-MiniLM-L6-v2 fine-tuned with MultipleNegativesRankingLoss, every layer trained
# (--freeze-layers 0), whole epochs, B = 64 and 256, code 256 tokens, for the arms ARMS and the
# seeds SEEDS, in ONE process (`hardbatch bench codesearch --time-budget`): the data are loaded
# once, the mined negatives and the teacher's embeddings computed once ($HARDBATCH_CACHE), the
# model read from disk per run.
#
# It sizes itself to BUDGET_S seconds, counted from its Python process's start:
#   1. timing: TIMING_STEPS steps after WARMUP untimed ones, per batch size and per arm without
#      +hardness (a +hardness arm is sized by its arm without it), each a short run in
#      OUT/timing/ (the per-step cost of the default and the community batches on the GPU), and
#      one evaluation of the starting model (the zeroshot run);
#   2. the cells in their pre-registered order: seed 1 of every (batch size, arm), then seed 2,
#      ...; a cell runs when its estimate (1.15 x (seconds around the steps + an evaluation +
#      steps x median s/step)) fits what is left, and the first that does not fit ends the grid
#      (the cells after it are not run either, so the order stays the one registered here);
#      the epochs: EPOCHS, or the largest whole number up to MAX_EPOCHS at which every cell fits.
# Every run's JSON records the budget, the timings and the cells skipped for time (`budget`);
# OUT/timing/budget_TIME.json the account of the whole command. Rerun the same command (a
# later GPU session) to continue: finished cells are skipped and cost nothing.
#
#   bash scripts/gpu_evidence.sh           # on a CUDA machine; OUT=results/code_search/gpu
#   bash scripts/gpu_evidence.sh --smoke   # the same code path, tiny, on the CPU (CI)
#   python scripts/report_code_search.py --in-place   # then: the page's GPU tables
#
# On a lent device machine, write under its $OUT (OUT=$OUT/gpu) and copy the files back into
# results/code_search/gpu/ here. --smoke: 128 training pairs, B 4 and 8, 2 steps (timing: 2
# after 1), code 32 tokens, seed 1, three arms, 12 test pairs and 9 distractors, fp32 on the
# CPU, into a new temporary folder (printed) unless OUT is given (cache: OUT/cache): its figures
# never replace the tracked results.
#
# Env: OUT, BUDGET_S (540), SEEDS ("1 2 3"), ARMS (default mined community+mined hardness
#      mined+hardness community), BATCH_SIZES ("64 256"), EPOCHS (1), MAX_EPOCHS (3),
#      SEQ (256: code tokens), TIMING_STEPS (20), WARMUP (5), DEVICE (cuda; smoke: cpu),
#      PRECISION (bf16; smoke: fp32), EVAL (test), THREADS (8; smoke: 1), HARDNESS (ib=10,all=10:
#      the +hardness arms' strengths, per mode, chosen by the CPU pilot of
#      docs/results/code_search.md, "Wave 2"), DATA_DIR (default:
#      $HARDBATCH_DATA, else shared/data in this checkout, else ../shared/data), TRAIN_LIMIT,
#      EXTRA (more options, e.g. "--model DIR").
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=""
if [[ "${1:-}" == "--smoke" ]]; then SMOKE=1; fi
if [[ -z "${OUT:-}" ]]; then
  if [[ -n "$SMOKE" ]]; then
    OUT="$(mktemp -d "${TMPDIR:-/tmp}/gpu_evidence_smoke.XXXXXX")" || exit 1
  else
    OUT=results/code_search/gpu
  fi
fi
mkdir -p "$OUT"
echo "[gpu_evidence] results: $OUT"
export PYTHONPATH="$PWD/src:$PWD/experiments/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
BUDGET_S=${BUDGET_S:-540}
list() { echo "$*" | tr ' ' ','; }
if [[ -n "$SMOKE" ]]; then
  export HARDBATCH_CACHE="$OUT/cache" TOKENIZERS_PARALLELISM=false
  ARGS=(--train-limit "${TRAIN_LIMIT:-128}" --steps 2 --timing-steps 2 --timing-warmup 1
        --max-seq-length "${SEQ:-32}" --max-query-length 16 --eval-limit 12 --distractors 9
        --device "${DEVICE:-cpu}" --precision "${PRECISION:-fp32}" --threads "${THREADS:-1}")
  SEEDS=${SEEDS:-1} BATCH_SIZES=${BATCH_SIZES:-4 8}
  ARMS=${ARMS:-default community+mined mined+hardness}
else
  export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-true}
  ARGS=(--epochs "${EPOCHS:-1}" --max-epochs "${MAX_EPOCHS:-3}" --freeze-layers 0
        --max-seq-length "${SEQ:-256}" --max-query-length 64
        --timing-steps "${TIMING_STEPS:-20}" --timing-warmup "${WARMUP:-5}"
        --device "${DEVICE:-cuda}" --precision "${PRECISION:-bf16}" --threads "${THREADS:-8}"
        --encode-batch-size 256 --eval-batch-size 256)
  [[ -n "${TRAIN_LIMIT:-}" ]] && ARGS+=(--train-limit "$TRAIN_LIMIT")
fi
if [[ -n "${DATA_DIR:-}" ]]; then
  ARGS+=(--data-dir "$DATA_DIR")
elif [[ -z "${HARDBATCH_DATA:-}" && -d shared/data/code ]]; then
  ARGS+=(--data-dir shared/data)
fi
start=$(date +%s)
# the budget counts from the process start; the limit leaves the last cell room to finish
# shellcheck disable=SC2086  # EXTRA: more options, split on purpose
timeout --kill-after=10 $((BUDGET_S + 45)) python3 -m hardbatch bench codesearch \
  --arm "$(list ${ARMS:-default mined community+mined hardness mined+hardness community})" \
  --seed-list "$(list ${SEEDS:-1 2 3})" --batch-sizes "$(list ${BATCH_SIZES:-64 256})" \
  --time-budget "$BUDGET_S" --eval-split "${EVAL:-test}" --out "$OUT" \
  --hardness-strength "${HARDNESS:-ib=10,all=10}" "${ARGS[@]}" ${EXTRA:-}
status=$?
echo "[gpu_evidence] done in $(( $(date +%s) - start )) s (exit $status); runs: $OUT," \
     "timings and the budget's account: $OUT/timing"
exit $status
