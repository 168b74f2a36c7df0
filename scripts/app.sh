#!/usr/bin/env bash
# Installs what it needs, then serves the explorer on the embedded default preset at http://127.0.0.1:7860
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh app
exec .venv/bin/python app.py "$@"
