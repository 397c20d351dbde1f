#!/usr/bin/env bash
# Install hardbatch (the library, with its test and integration extras) and, beside it, the
# experiments distribution (experiments/: hardbatch-experiments, the demo and the recipes).
# torch is installed first and pinned so that no extra pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test,integrations]"
python3 -m pip install -q -e ./experiments
