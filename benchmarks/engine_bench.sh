#!/usr/bin/env bash
# Engine mode's table (BENCHMARKS.md): vLLM with n-gram drafts, with a draft model and without speculation, the same
# preset, interleaved at concurrency 1, 4 and 16. Starts the three servers (one after another, pinned to the CPUs in
# THREADS) unless they already answer, then prints a markdown table and writes JSON, CSV and an HTML report to OUT.
#   bash benchmarks/engine_bench.sh tiny code 4 2 "--ignore-eos"
#   bash benchmarks/engine_bench.sh smollm2-135m chat 3 1 ""
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-tiny}; PROMPTS=${2:-code}; GAMMA=${3:-4}; REPEATS=${4:-2}; EXTRA=${5:-"--ignore-eos"}
THREADS=${THREADS:-0}; OUT=${OUT:-benchmarks/out/engine-$PRESET}; BASE=${BASE_PORT:-8040}
mkdir -p "$OUT"
declare -A PORT=([off]=$BASE [ngram]=$((BASE + 1)) [draft]=$((BASE + 2)))
for spec in off ngram draft; do
  if ! curl -sf "http://127.0.0.1:${PORT[$spec]}/health" >/dev/null; then
    .venv/bin/python -m explorer engine start --preset "$PRESET" --spec "$spec" --gamma "$GAMMA" \
      --port "${PORT[$spec]}" --threads "$THREADS" --timeout 900
  fi
done
# shellcheck disable=SC2086
.venv/bin/python -m explorer engine bench --url "http://127.0.0.1:${PORT[ngram]}" \
  --compare "http://127.0.0.1:${PORT[draft]}" --compare "http://127.0.0.1:${PORT[off]}" --prompts "$PROMPTS" \
  --concurrency 1,4,16 --repeats "$REPEATS" --max-tokens 64 $EXTRA --json \
  --csv "$OUT/requests.csv" --report "$OUT/report.html" > "$OUT/summary.json"
.venv/bin/python - "$OUT/summary.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
pred = {(p["label"], p["concurrency"]): p["predicted_gain"] for p in data["predicted"] or []}
print("| server | c | batch run | tok/s | gain (measured) | gain (predicted) | e2e p50 / p99 ms | ITL p50 / p99 ms"
      " | TTFT p99 ms | acceptance | tokens/step | by position |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
num = lambda v, f: f.format(v) if isinstance(v, (int, float)) and v == v else "–"
for r in data["rows"]:
    acc = r["acceptance"] if isinstance(r["acceptance"], str) else num(r["acceptance"], "{:.3f}")
    print(f"| {r['label']} | {r['concurrency']} | {num(r['mean_running'], '{:.1f}')} | {num(r['throughput_tok_s'], '{:.0f}')}"
          f" | {num(r.get('speedup_throughput'), '{:.2f}×')} | {num(pred.get((r['label'], r['concurrency'])), '{:.2f}×')}"
          f" | {num(r['e2e_p50_ms'], '{:.0f}')} / {num(r['e2e_p99_ms'], '{:.0f}')}"
          f" | {num(r['itl_p50_ms'], '{:.1f}')} / {num(r['itl_p99_ms'], '{:.1f}')} | {num(r['ttft_p99_ms'], '{:.0f}')}"
          f" | {acc} | {num(r.get('tokens_per_step'), '{:.2f}')} | {r.get('acceptance_by_position', '')} |")
PY
