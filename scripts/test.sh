#!/usr/bin/env bash
# The README's test command: the whole suite (needs ../shared/data beside the repo for the
# real-data tests, or HARDBATCH_DATA pointing at that folder).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pytest -q "$@"
