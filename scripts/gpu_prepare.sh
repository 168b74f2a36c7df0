#!/usr/bin/env bash
# Prepares the device check (issue 26) HERE, on a machine with network, for a GPU machine without network:
#   1. ignores .gpu/ (.git/info/exclude; nothing in it is tracked),
#   2. downloads the wheels the GPU machine lacks into .gpu/wheels (pinned in requirements.txt; Python 3.12,
#      x86-64, as the device README says),
#   3. with --baseline, measures the same lanes on this CPU into .gpu/cpu_baseline.json (minutes on 2 cores),
#   4. splits the smollm2-135m target GGUF into chunks sized from what travels anyway, writes .gpu/manifest.json
#      and prints the device run calls to make, in order (command and carry list each).
# Usage: scripts/gpu_prepare.sh [--baseline] [--tree-mib N] [--margin-mib N] [--dry]
# What the GPU machine already has (KINDS.md, 2026-11): torch 2.11, transformers 5.17 (older than our 5.23),
# tokenizers 0.23.2, safetensors 0.8.0, accelerate 1.15.0, huggingface_hub 1.33 (transformers 5.23 needs >= 1.31;
# our 2.4 would need httpx2, absent there), peft (version not read), numpy, scipy; no gguf, no gradio. So carried:
# transformers, tokenizers, peft and gguf at our pins (GPU_WHEELS overrides the list).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
baseline=0; plan_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) baseline=1 ;;
    --tree-mib|--margin-mib) plan_args+=("$1" "$2"); shift ;;
    --dry) plan_args+=("$1") ;;
    *) echo "usage: $0 [--baseline] [--tree-mib N] [--margin-mib N] [--dry]" >&2; exit 2 ;;
  esac
  shift
done

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
mkdir -p .gpu/wheels

pins=()
for name in ${GPU_WHEELS:-transformers tokenizers peft gguf}; do
  pin=$(grep -iE "^${name}==" requirements.txt || true)
  [ -n "$pin" ] || { echo "gpu_prepare: $name is not pinned in requirements.txt" >&2; exit 2; }
  pins+=("$pin")
done
stamp=".gpu/wheels/.pins-$(printf '%s\n' "${pins[@]}" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  rm -f .gpu/wheels/*.whl .gpu/wheels/.pins-*  # one version of each: two stop the install there
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .gpu/wheels "${pins[@]}"
  touch "$stamp"
fi
ls -l .gpu/wheels/*.whl | awk '{printf "wheel %s (%.1f MiB)\n", $NF, $5 / 1048576}'

if [ "$baseline" = 1 ]; then
  echo "CPU baseline (the same lanes, float32, no audit or bf16) into .gpu/cpu_baseline.json ..."
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PY" benchmarks/gpu_check.py --device cpu --skip audit,bf16 \
    --budget 1800 --out .gpu/cpu_baseline.json --md .gpu/cpu_baseline.md || true
fi

gguf=$("$PY" -c "from explorer.families.smollm2 import smollm2_gguf_path; print(smollm2_gguf_path())")
exec "$PY" scripts/gpu_plan.py plan --gguf "$gguf" "${plan_args[@]}"
