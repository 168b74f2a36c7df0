#!/usr/bin/env bash
# Reproduce the numbers in BENCHMARKS.md (tiny preset, CPU). Results land in runs/ (git-ignored).
# Run with nothing else busy on the machine: every request is timed alone, but a background job
# sharing the cores inflates and spreads the latencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/tiny}
THREADS=${THREADS:-1}  # one intra-op thread: robust on a shared 2-core machine (see BENCHMARKS.md)
mkdir -p "$OUT"

# 1. AR vs speculative vs diffusion on code prompts (temperature 0), the batch sweep (c and the predicted
#    speedup from this run's acceptance) and the peer comparison with transformers, in one run.
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code --limit 16 --repeats 3 --max-new-tokens 64 --steps 16 \
    --sweep bench,batch --peer --csv "$OUT/bench.csv" --report "$OUT/bench.html"

# 2. Diffusion break-even: latency against N for AR, speculative and diffusion at K = N/2, N/4, N/8, N/16.
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code --limit 6 --sweep diffusion \
    --csv "$OUT/breakeven.csv" --report "$OUT/breakeven.html"

# 3. Where speculation helps and where it hurts: drafters across prompt sets; temperature; gamma.
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code,code_edit,prose,multilingual --limit 6 --sweep drafter \
    --csv "$OUT/drafters.csv" --report "$OUT/drafters.html"
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code --limit 6 --repeats 2 --sweep temperature,gamma,memory \
    --csv "$OUT/temperature.csv" --report "$OUT/temperature.html"
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts high_temperature --methods autoregressive,speculative \
    --csv "$OUT/hot.csv"

# 5. The best gamma for this pair (gamma = 1), re-measured with the batch sweep and the peer comparison.
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code --limit 16 --repeats 2 --max-new-tokens 64 \
    --gamma 1 --methods autoregressive,speculative --sweep bench,batch --peer \
    --csv "$OUT/gamma1.csv" --report "$OUT/gamma1.html"

# 7. Issue 10: the diffusion KV cache (none / prefix / dual at N = 64, 128, 256, K = N/4, blocks of 32), the
#    diffusion drafter against the model drafter and prompt lookup at gamma 2, 4, 8, and the break-even
#    re-measured with the default cache.
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code --limit 3 --sweep cache \
    --csv "$OUT/cache.csv"
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code,code_edit --limit 2 --max-new-tokens 64 \
    --sweep drafter_gamma --csv "$OUT/drafter_gamma.csv"
$PY -m explorer bench --preset tiny --threads "$THREADS" --prompts code --limit 3 --sweep diffusion --no-quality \
    --csv "$OUT/breakeven_cache.csv" --report "$OUT/breakeven_cache.html"
