#!/usr/bin/env bash
# The peer benchmark's own venv (benchmarks/peer_speed.py): llama-cpp-python built from source with cmake/gcc.
# Not a dependency of the app or the tests. About 10 minutes on one core.
# On a CPU with AMX, ggml's AMX int8 path is compiled out (-mno-amx-*): llama-cpp-python 0.3.36 built with it
# segfaulted in llama_decode on the Q4_1 GGUF on a 2-core Xeon (2026-12-03). EXPLORER_PEER_AMX=1 keeps it.
set -euo pipefail
venv=${EXPLORER_BENCH_VENV:-$HOME/.cache/decoding-explorer/bench-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
args="-DGGML_NATIVE=ON"
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null && [ "${EXPLORER_PEER_AMX:-0}" != 1 ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  args="$args -DCMAKE_C_FLAGS='$flags' -DCMAKE_CXX_FLAGS='$flags'"
fi
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-1} CMAKE_ARGS=${CMAKE_ARGS:-$args} \
  "$venv/bin/pip" install -q --disable-pip-version-check llama-cpp-python
"$venv/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ready in $venv')"
