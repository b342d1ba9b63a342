#!/usr/bin/env bash
# The README's serve command: set up .venv (if needed) and serve the default model on 127.0.0.1:8080.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/embedder serve "$@"
