#!/usr/bin/env bash
# The device check (issue 26), run THERE, on the lent GPU machine, by the calls scripts/gpu_prepare.sh prints.
#   --setup     (call 1) install the carried wheels into .gpu/site and try the stack: versions, and a short decode
#               of random-tiny on the device, so that a machine that cannot run the check says so at once
#   --stage K   append chunk K (carried as .gpu/chunks/KK.part) to .gpu/target/<gguf>, checking sha256s; the
#               files under .gpu/ are ignored, so they stay on the machine between calls while it is warm
#   --run       (the last call) check the assembled GGUF's sha256, then run benchmarks/gpu_check.py on the device;
#               the report lands in $OUT (gpu_check.json, gpu_check.md, gpu_check.log)
# Environment: GPU_CHECK_BUDGET (seconds the checks may take, default 360), GPU_CHECK_TIMEOUT (hard stop of the
# Python check, default 480), GPU_CHECK_ARGS (more arguments for benchmarks/gpu_check.py), GPU_CHECK_DEVICE
# (default cuda; cpu rehearses the calls on a CPU machine), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
setup=0; stage=""; run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --setup) setup=1 ;;
    --stage) stage=$2; shift ;;
    --run) run=1 ;;
    *) echo "usage: $0 [--setup] [--stage K] [--run]" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$PWD/.gpu/out}
mkdir -p "$OUT"
# The installed wheels and the assembled GGUF live outside the working tree (the device tool may clear ignored
# folders of the tree between calls; its /tmp stays while the machine is warm); .gpu/site and .gpu/target point there.
STATE=${GPU_CHECK_STATE:-/tmp/explorer-gpu-state}
mkdir -p "$STATE/site" "$STATE/target" .gpu
for d in site target; do [ -L ".gpu/$d" ] || rm -rf ".gpu/$d"; ln -sfn "$STATE/$d" ".gpu/$d"; done
export PYTHONPATH=$PWD/.gpu/site${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ "$setup" = 1 ]; then
  rm -rf "$STATE/site"/* "$STATE/target"/*
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site \
    .gpu/wheels/*.whl
  { nvidia-smi -L || true; "$PY" - "$DEVICE" <<'PYEOF'
import sys, time
import torch, transformers, tokenizers, gguf, peft
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "| transformers", transformers.__version__, "| tokenizers", tokenizers.__version__, "| peft", peft.__version__)
import explorer
t = time.perf_counter()
m = explorer.load_models("random-tiny", device=sys.argv[1])
ar = explorer.decode("autoregressive", m, "def f(x):", max_new_tokens=8).token_ids
spec = explorer.decode("speculative", m, "def f(x):", max_new_tokens=8, drafter="prompt_lookup").token_ids
print(f"setup: random-tiny on {m.device}: AR {ar}, speculative equal: {spec == ar} ({time.perf_counter() - t:.1f} s)")
PYEOF
  } 2>&1 | tee "$OUT/gpu_setup.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "setup failed: stop here, the check cannot run on this machine" >&2; exit 3; }
fi
if [ -n "$stage" ]; then "$PY" scripts/gpu_plan.py stage "$stage"; fi
[ "$run" = 1 ] || exit 0

[ -d .gpu/site/transformers ] || { echo "no .gpu/site here: the machine was given back since call 1; start again" \
  "at call 1" >&2; exit 3; }
gguf=$("$PY" scripts/gpu_plan.py verify | sed -n 's/^verified: \(.*\) sha256 .*/\1/p')
[ -n "$gguf" ] || exit 3
export EXPLORER_SMOLLM2_GGUF=$gguf
{ nvidia-smi -L || true; } 2>&1 | tee "$OUT/gpu_check.log"
baseline=(); [ -f .gpu/cpu_baseline.json ] && baseline=(--cpu-baseline .gpu/cpu_baseline.json)
set +e
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of arguments
timeout -k 10 "${GPU_CHECK_TIMEOUT:-480}" "$PY" benchmarks/gpu_check.py --device "$DEVICE" \
  --budget "${GPU_CHECK_BUDGET:-360}" --out "$OUT/gpu_check.json" --md "$OUT/gpu_check.md" "${baseline[@]}" \
  ${GPU_CHECK_ARGS:-} 2>&1 | tee -a "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
[ -f "$OUT/gpu_check.md" ] && cat "$OUT/gpu_check.md"
echo "gpu_check.py exit status $rc (0: every check passed, differed in bfloat16 or was skipped; 1: a check failed" \
  "or raised; 124: timed out)"
exit "$rc"
