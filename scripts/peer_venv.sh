#!/usr/bin/env bash
# The peer benchmark's own venv (benchmarks/peer_speed.py): llama-cpp-python built from source with cmake/gcc.
# Not a dependency of the app or the tests. About 10 minutes on one core.
set -euo pipefail
venv=${EXPLORER_BENCH_VENV:-$HOME/.cache/decoding-explorer/bench-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-1} CMAKE_ARGS=${CMAKE_ARGS:--DGGML_NATIVE=ON} \
  "$venv/bin/pip" install -q --disable-pip-version-check llama-cpp-python
"$venv/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ready in $venv')"
