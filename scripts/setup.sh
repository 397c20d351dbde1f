#!/usr/bin/env bash
# Install hardbatch with its test and demo dependencies (CPU PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
