"""The explorer beside the engines a CPU user would pick, on the same GGUF and the same prompts.

    bash scripts/peer_venv.sh        # once: llama-cpp-python built from source in its own venv (~10 min, one core)
    python benchmarks/peer_speed.py [--limit 6] [--tokens 64] [--threads 1,2] [--precisions int8,float32]
        [--paths avx2,portable] [--spec]

For each thread count, on held-out chat prompts (chat template applied, greedy, ``--tokens`` new tokens, prefill
included in the time), interleaved per prompt: llama.cpp (llama-cpp-python over SmolLM2-135M-Instruct.Q4_1.gguf,
the file the default preset dequantizes), the explorer's autoregressive decoder at each precision, and
transformers' ``generate`` on the float32 target. llama.cpp runs in a worker process of the benchmark venv
(``~/.cache/decoding-explorer/bench-venv``; it is not a dependency of the app) that answers JSON lines.
``--paths`` runs the exact precisions once per kernel path (``EXPLORER_KERNEL_ISA``, switched around each decode:
the int8 weights' layout is the same on every path but AMX, so run an AMX machine with EXPLORER_NO_AMX=1), and
``--spec`` adds the preset's speculative decoding (its measured defaults) beside each exact AR row.
Prints tokens/s (new tokens over wall time, median over prompts) and each engine's time per token over llama.cpp's,
and each row's speed over the float32 target's and (speculative) over its own autoregressive decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from benchmarks.smollm2_card import heldout  # noqa: E402  (the same held-out prompts)
from explorer.decoding.api import encode_prompt  # noqa: E402
from explorer.families.smollm2 import smollm2_gguf_path  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.precision import EXACT, kernels  # noqa: E402

BENCH_PY = Path(os.environ.get("EXPLORER_BENCH_VENV", Path.home() / ".cache/decoding-explorer/bench-venv")) / \
    "bin" / "python"
WORKER = r"""
import json, sys, time
from llama_cpp import Llama
gguf, threads = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
models = {t: Llama(model_path=gguf, n_threads=t, n_threads_batch=t, n_ctx=1024, verbose=False) for t in threads}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    llm = models[job["threads"]]
    llm.reset()
    start = time.perf_counter()
    out = llm.create_completion(job["ids"], max_tokens=job["tokens"], temperature=0.0, top_k=1)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "new_tokens": out["usage"]["completion_tokens"],
                      "text": out["choices"][0]["text"]}), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precisions", default="int8,float32", help="comma list; 'default' is the preset as loaded")
    ap.add_argument("--paths", default="", help="kernel paths for the exact precisions (default: this CPU's best)")
    ap.add_argument("--spec", action="store_true", help="also the preset's speculative decoding at each exact row")
    args = ap.parse_args()
    if not BENCH_PY.exists():
        raise SystemExit(f"error: no benchmark venv at {BENCH_PY.parent.parent}; run bash scripts/peer_venv.sh")
    threads = [int(t) for t in args.threads.split(",")]
    # "default": the preset as load_models() gives it (its precision and speculative defaults measured here)
    bundles = {p: explorer.load_models("smollm2-135m" if p == "default" else f"smollm2-135m@{p}")
               for p in args.precisions.split(",")}
    fp32 = bundles.get("float32") or explorer.load_models("smollm2-135m@float32")
    worker = subprocess.Popen([str(BENCH_PY), "-c", WORKER, str(smollm2_gguf_path()), args.threads],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert json.loads(worker.stdout.readline())["ready"]

    def llama(ids: list[int], t: int) -> tuple[float, int]:
        worker.stdin.write(json.dumps({"ids": ids, "threads": t, "tokens": args.tokens}) + "\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        if not line:  # the worker died (a crash inside llama.cpp): say so, not a JSON traceback
            raise SystemExit(f"error: llama.cpp's worker exited with status {worker.wait()}; on a CPU with AMX "
                             "rebuild the venv without ggml's AMX path: bash scripts/peer_venv.sh")
        r = json.loads(line)
        return r["seconds"], r["new_tokens"]

    def explorer_run(models, prompt: str, path: str | None, method: str = "autoregressive") -> tuple[float, int]:
        before = os.environ.get(kernels.ENV)
        if path:
            os.environ[kernels.ENV] = path
        try:
            trace = explorer.decode(method, models, prompt, max_new_tokens=args.tokens)
        finally:
            if path:
                os.environ.pop(kernels.ENV) if before is None else os.environ.__setitem__(kernels.ENV, before)
        return trace.stats["wall_s"], len(trace.token_ids)

    def generate(ids: list[int]) -> tuple[float, int]:
        x = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = fp32.target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.tokens,
                                       do_sample=False, pad_token_id=fp32.tokenizer.pad_token_id)
        return time.perf_counter() - start, out.shape[1] - x.shape[1]

    prompts = heldout(args.limit)
    paths = [p for p in args.paths.split(",") if p] or [None]
    runs = {}  # engine label -> (bundle, path, method)
    for p, models in bundles.items():
        for path in (paths if models.precision in EXACT else [None]):
            where = f" ({path})" if path else ""
            runs[f"explorer AR {p}{where}"] = (models, path, "autoregressive")
            if args.spec and models.precision in EXACT:
                runs[f"explorer speculative {p}{where}"] = (models, path, "speculative")
    engines = ["llama.cpp Q4_1"] + list(runs) + ["transformers generate float32"]
    rows = {(e, t): [] for e in engines for t in threads}
    for t in threads:
        torch.set_num_threads(t)
        for i, prompt in enumerate([prompts[0]] + prompts):  # the first prompt once more, as a warm-up
            ids = list(encode_prompt(fp32.tokenizer, prompt, True)[0])
            results = {"llama.cpp Q4_1": llama(ids, t), "transformers generate float32": generate(ids)}
            for label, (models, path, method) in runs.items():
                results[label] = explorer_run(models, prompt, path, method)
            if i > 0:
                for e, (s, n) in results.items():
                    rows[(e, t)].append((s, n))
            print(f"threads {t}: prompt {i}/{len(prompts)}", file=sys.stderr)
    worker.stdin.close()
    worker.wait(timeout=60)
    print(f"\n## Peer speed on {cpu_name()}, {len(prompts)} held-out chat prompts, {args.tokens} new tokens, greedy, "
          "prefill included, interleaved per prompt")
    print("| engine | threads | tokens/s (median over prompts) | time per token / llama.cpp's | speed / float32 AR "
          "| speculative / own AR |")
    print("|---|---|---|---|---|---|")

    def rate(e: str, t: int) -> float:  # tokens over seconds, summed over prompts (a ratio of sums)
        return sum(n for _, n in rows[(e, t)]) / sum(s for s, _ in rows[(e, t)])

    for t in threads:
        base = statistics.median(n / s for s, n in rows[("llama.cpp Q4_1", t)])
        fp32_label = "explorer AR float32" if "explorer AR float32" in engines else "transformers generate float32"
        for e in engines:
            tps = statistics.median(n / s for s, n in rows[(e, t)])
            own = e.replace("speculative", "AR")
            spec = f"{rate(e, t) / rate(own, t):.2f}x" if "speculative" in e else ""
            print(f"| {e} | {t} | {tps:.1f} | {base / tps:.2f}x | {rate(e, t) / rate(fp32_label, t):.2f}x | {spec} |")


if __name__ == "__main__":
    main()
