#!/usr/bin/env bash
# The README's test command: set up .venv (if needed) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
bash scripts/deploy-tools.sh
exec .venv/bin/python -m pytest "$@"
