#!/usr/bin/env bash
# Install hardbatch with the demo, test and integration dependencies (CPU PyTorch).
# torch is installed first and pinned so that no extra pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test,integrations]"
