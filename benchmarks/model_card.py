"""The numbers in assets/models/tiny/README.md, measured on held-out code prompts.

    python benchmarks/model_card.py [--limit 16] [--threads 1]

1. Speculative decoding with the distilled draft at temperature 0: tokens per target pass and
   acceptance at gamma = 4, and the speedup over autoregressive decoding for each gamma, timed
   interleaved in one run (AR, spec, AR, spec, ... per prompt).
2. Diffusion quality next to speed: generative perplexity under the target (judge) and token
   entropy of N = 64 outputs at K in {64, 32, 16}, one block and blocks of 8, next to the
   target's own samples at temperature 1 (fixed length: EOS ignored, as vLLM's --ignore-eos).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.measure.workload import ignoring_eos, load_prompt_sets, score_quality  # noqa: E402


def speculative_table(models, prompts, gammas, tokens):
    for prompt in prompts[:2]:  # warm-up
        explorer.decode("speculative", models, prompt, max_new_tokens=8)
        explorer.decode("autoregressive", models, prompt, max_new_tokens=8)
    print(f"\n## Speculative (model drafter, temperature 0, {tokens} new tokens, {len(prompts)} held-out prompts)")
    print("| gamma | tokens / target pass | acceptance rate | speedup vs AR (tokens/s, interleaved) |")
    print("|---|---|---|---|")
    for gamma in gammas:
        ar_s = spec_s = ar_n = spec_n = 0.0
        passes = new = accepted = proposed = 0
        for prompt in prompts:
            ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=tokens)
            spec = explorer.decode("speculative", models, prompt, max_new_tokens=tokens, gamma=gamma)
            assert spec.token_ids == ar.token_ids
            ar_s, ar_n = ar_s + ar.stats["wall_s"], ar_n + ar.stats["new_tokens"]
            spec_s, spec_n = spec_s + spec.stats["wall_s"], spec_n + spec.stats["new_tokens"]
            passes += spec.stats["target_forward_passes"]
            new += spec.stats["new_tokens"]
            accepted += spec.stats["accepted"]
            proposed += spec.stats["proposed"]
        speedup = (spec_n / spec_s) / (ar_n / ar_s)
        print(f"| {gamma} | {new / passes:.2f} | {accepted / proposed:.3f} | {speedup:.2f}x |")


def diffusion_table(models, prompts, n):
    fixed = ignoring_eos(models)
    rows = [("autoregressive, temperature 1", "autoregressive", dict(temperature=1.0)),
            ("autoregressive, greedy", "autoregressive", dict(temperature=0.0))]
    for k in (n, n // 2, n // 4):
        rows.append((f"diffusion K={k}, one block, temperature 1", "diffusion", dict(steps=k, temperature=1.0)))
        rows.append((f"diffusion K={k}, blocks of 8, temperature 1", "diffusion",
                     dict(steps=k, block_length=8, temperature=1.0)))
    rows.append((f"diffusion K={n}, one block, greedy", "diffusion", dict(steps=n)))
    rows.append((f"diffusion K={n}, blocks of 8, greedy", "diffusion", dict(steps=n, block_length=8)))
    print(f"\n## Quality next to speed (N = {n} new tokens, EOS ignored, {len(prompts)} held-out prompts)")
    print("| decoder | generative perplexity (target as judge), median | token entropy (bits), mean | "
          "latency ms, median | passes |")
    print("|---|---|---|---|---|")
    for label, method, kw in rows:
        ppl, ent, lat, passes = [], [], [], []
        for i, prompt in enumerate(prompts):
            trace = explorer.decode(method, fixed, prompt, max_new_tokens=n, seed=i, **kw)
            q = score_quality(models, trace)
            ppl.append(q["perplexity"])
            ent.append(q["token_entropy_bits"])
            lat.append(trace.stats["wall_s"] * 1e3)
            passes.append(trace.stats["target_forward_passes"])
        print(f"| {label} | {statistics.median(ppl):.1f} | {statistics.mean(ent):.2f} | "
              f"{statistics.median(lat):.0f} | {statistics.median(passes):.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gammas", default="1,2,3,4,6")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = explorer.load_models("tiny", device="cpu")
    prompts = [p.text for p in load_prompt_sets("code", limit=args.limit)[0].prompts]
    print(f"torch threads {args.threads}; cpu: {cpu_name()}")
    speculative_table(models, prompts, [int(g) for g in args.gammas.split(",")], args.tokens)
    diffusion_table(models, prompts, args.tokens)


if __name__ == "__main__":
    main()
