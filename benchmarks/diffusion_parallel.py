"""Does the diffusion partner commit several tokens per pass, and at what quality? Two adapters side by side.

    python benchmarks/diffusion_parallel.py [--new DIR] [--old assets/models/smollm2-135m/diffusion] [--limit 12]
        [--tokens 64] [--block 8] [--thresholds 0.9,0.7] [--threads 1] [--samples] [--kernels int8|none]

On held-out chat prompts (topics no training prompt mentions), each adapter decodes at N = ``--tokens`` with
blocks of ``--block``: at K = N (one position a pass) and with Fast-dLLM threshold decoding at each threshold
(every position above it revealed, at least one), greedy; adapters interleaved per prompt. The decode stops once
the answer has ended, so "tokens per pass" is the answer's tokens (to its end-of-turn) over the denoiser passes
actually made. Quality at T = 1 (threshold 0.9): generative perplexity under the target, token entropy and distinct
3-grams of the diffusion samples next to the target's own T = 1 samples on the same prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from benchmarks.smollm2_card import heldout  # noqa: E402  (the same held-out prompts)
from explorer.families.smollm2.diffusion_adapter import load_diffusion_adapter  # noqa: E402
from explorer.measure.workload import distinct_ngram_ratio, score_quality  # noqa: E402
from explorer.precision.exact import use_kernels_in_diffusion  # noqa: E402


def adapter(models, folder: Path, kernels: str | None = None):
    """The adapter merged into the float32 target; on the kernels in ``kernels`` (int8, as the default precision
    runs it) or, without, as torch's float32 path runs it (bf16 on a CPU with native bf16)."""
    model = load_diffusion_adapter(folder, models.target, torch.float32)
    if kernels:
        use_kernels_in_diffusion(model, kernels)
    elif next(models.diffusion.parameters()).dtype == torch.bfloat16:
        model.to(torch.bfloat16)  # the preset's rule on this CPU at precision float32: the diffusion model in bf16
    return dataclasses.replace(models, diffusion=model.eval().requires_grad_(False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, default=Path("assets/models/smollm2-135m/diffusion"))
    ap.add_argument("--new", type=Path, default=None, help="an exported adapter folder to compare with --old")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--thresholds", default="0.9,0.7")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--samples", action="store_true", help="print each adapter's T = 1 outputs")
    ap.add_argument("--quality-thresholds", default="0.9",
                    help="the thresholds whose T = 1 samples are scored (comma list; each adapter at each)")
    ap.add_argument("--kernels", default="int8", help="the weight format on the target's kernels (int8: the default "
                    "precision's; 'none': torch's float32 path, bf16 on a CPU with native bf16)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = explorer.load_models("smollm2-135m@float32")  # the adapters need the float32 target to merge into
    kernels = None if args.kernels == "none" else args.kernels
    bundles = {"old": adapter(base, args.old, kernels)}
    if args.new is not None:
        bundles["new"] = adapter(base, args.new, kernels)
    prompts = heldout(args.limit)
    n, b = args.tokens, args.block
    configs = [("K = N", {"steps": n})] + [(f"threshold {t}", {"steps": n, "threshold": float(t)})
                                           for t in args.thresholds.split(",")]
    stats = {(name, label): {"tokens": 0, "passes": 0, "per_pass": [], "s": 0.0} for name in bundles
             for label, _ in configs}
    q_thresholds = [float(t) for t in args.quality_thresholds.split(",")]
    samplers = [f"{name} @ {t}" for name in bundles for t in q_thresholds] + ["target T=1"]
    quality = {name: {"ppl": [], "ent": [], "dist": []} for name in samplers}
    samples = {name: [] for name in quality}
    for i, prompt in enumerate(prompts):
        for label, options in configs:
            for name, models in bundles.items():  # interleaved per prompt
                trace = explorer.decode("diffusion", models, prompt, max_new_tokens=n, block_length=b, **options)
                st = stats[(name, label)]
                st["tokens"] += len(trace.token_ids)
                st["passes"] += trace.stats["target_forward_passes"]
                st["per_pass"].append(len(trace.token_ids) / max(1, trace.stats["target_forward_passes"]))
                st["s"] += trace.stats["wall_s"]
        runs = {f"{name} @ {t}": explorer.decode("diffusion", models, prompt, max_new_tokens=n, block_length=b,
                                                 steps=n, threshold=t, temperature=1.0, seed=i)
                for name, models in bundles.items() for t in q_thresholds}
        runs["target T=1"] = explorer.decode("autoregressive", base, prompt, max_new_tokens=n, temperature=1.0,
                                             seed=i)
        for name, trace in runs.items():
            q = score_quality(base, trace)
            quality[name]["ppl"].append(q["perplexity"])
            quality[name]["ent"].append(q["token_entropy_bits"])
            quality[name]["dist"].append(distinct_ngram_ratio(trace.token_ids))
            samples[name].append(trace.text)
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr)
    print(f"\n## Diffusion at N = {n}, blocks of {b}, greedy, {len(prompts)} held-out prompts, "
          f"{args.threads} thread(s); the decode stops at the answer's end")
    print("| adapter | schedule | answer tokens / denoiser pass (pooled) | per prompt, median [min, max] | "
          "passes per answer | seconds per answer |")
    print("|---|---|---|---|---|---|")
    for (name, label), st in stats.items():
        pp = st["per_pass"]
        print(f"| {name} | {label} | {st['tokens'] / max(1, st['passes']):.2f} | {statistics.median(pp):.2f} "
              f"[{min(pp):.2f}, {max(pp):.2f}] | {st['passes'] / len(prompts):.1f} | {st['s'] / len(prompts):.2f} |")
    print(f"\n## Quality at T = 1 (diffusion at each threshold), N = {n}: medians over {len(prompts)} prompts")
    print("| sampler @ threshold | perplexity under the target | token entropy (bits) | distinct 3-grams |")
    print("|---|---|---|---|")
    for name, q in quality.items():
        print(f"| {name} | {statistics.median(q['ppl']):.1f} | {statistics.median(q['ent']):.2f} | "
              f"{statistics.median(q['dist']):.2f} |")
    if args.samples:
        for name, texts in samples.items():
            print(f"\n### {name}")
            for t in texts:
                print("-", t.replace("\n", " ")[:300])


if __name__ == "__main__":
    main()
