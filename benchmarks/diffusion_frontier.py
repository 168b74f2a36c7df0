"""The diffusion samplers' quality-speed frontier on the default preset: which rule commits the most per pass while
the answers stay as good as the target's own.

    python benchmarks/diffusion_frontier.py [--preset smollm2-135m] [--limit 12] [--tokens 64,128] [--threads 1]
        [--settings "confidence:threshold=0.7;dilated:threshold=0.5;..."] [--show SETTING] [--no-sample]

Held-out chat prompts (benchmarks/smollm2_card.heldout: topics the diffusion partner never trained on), blocks of
N/8 as the app's lane. Per prompt, interleaved: the target's autoregressive answer and each sampler setting, greedy
(speed: answer tokens per denoiser pass, wall time against autoregressive) and at T = 1 (quality: perplexity under
the target, distinct 3-grams, the rate of adjacent repeated words; the target's own T = 1 samples beside them).
Wall vs AR is the sum of the diffusion decodes' wall times over the sum of the autoregressive ones (both stop at the
answer's end). Repeats and distinct-3 are given greedy / T = 1. A setting "apd:gamma=4" is the autoregressive check
(APD, Israel et al. 2025): the diffusion partner drafts, the target keeps what it agrees with (speculative decoding
with the diffusion drafter; its tokens / pass are per target pass, and its text is the target's own).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from benchmarks.smollm2_card import heldout  # noqa: E402  (the same held-out prompts)
from explorer.decoding.events import RefinementStep  # noqa: E402
from explorer.measure.workload import score_quality  # noqa: E402

DEFAULT_SETTINGS = ("confidence:threshold=0.9;confidence:threshold=0.7;confidence:threshold=0.5;"
                    "entropy:entropy_bound=0.1;entropy:entropy_bound=0.3;entropy:entropy_bound=1;"
                    "dilated:threshold=0.7;dilated:threshold=0.5;dilated:threshold=0.3;"
                    "revoke:threshold=0.5,revoke_below=0.3;revoke:threshold=0.3,revoke_below=0.5")


def parse_settings(text: str) -> list[tuple[str, dict]]:
    """"dilated:threshold=0.5;entropy:entropy_bound=0.3" -> [(label, decode options)]."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        sampler, _, rest = item.partition(":")
        options = {"sampler": sampler}
        for pair in filter(None, rest.split(",")):
            key, _, value = pair.partition("=")
            key = key.strip()
            options[key] = (int(float(value)) if key in ("gamma", "draft_passes", "no_repeat_ngram")
                            else value.strip() in ("1", "true") if key == "no_adjacent_repeat"
                            else value.strip() if key == "cache" else float(value))
        out.append((item, options))
    return out


def decode(models, method, prompt, **options):
    start = time.perf_counter()
    trace = explorer.decode(method, models, prompt, **options)
    return trace, time.perf_counter() - start


def passes(trace) -> int:
    return sum(isinstance(e, RefinementStep) for e in trace.events)


def mean(xs):
    xs = [x for x in xs if x == x]  # NaN: too short to score
    return statistics.fmean(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--tokens", default="64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settings", default=DEFAULT_SETTINGS)
    ap.add_argument("--show", default=None, help="print every answer of this setting (and the AR one) at T = 0")
    ap.add_argument("--no-sample", action="store_true", help="greedy only (no T = 1 quality)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = explorer.load_models(args.preset)
    prompts = heldout(args.limit)
    settings = parse_settings(args.settings)
    explorer.decode("diffusion", models, prompts[0], max_new_tokens=8)  # warm-up
    explorer.decode("autoregressive", models, prompts[0], max_new_tokens=8)
    for n in (int(x) for x in args.tokens.split(",")):
        block = max(1, n // 8)
        rows = {label: {"tok": 0, "passes": 0, "wall": 0.0, "ppl": [], "d3": ([], []), "rep": ([], [])}
                for label in ["autoregressive"] + [s for s, _ in settings]}
        for i, prompt in enumerate(prompts):
            runs = [("autoregressive", "autoregressive", {})] + [
                (s, "speculative", {"drafter": "diffusion", **{k: v for k, v in o.items() if k != "sampler"}})
                if o["sampler"] == "apd" else (s, "diffusion", {"block_length": block, **o}) for s, o in settings]
            for label, method, options in runs:
                r = rows[label]
                greedy, wall = decode(models, method, prompt, max_new_tokens=n, **options)
                q = score_quality(models, greedy)
                r["tok"] += len(greedy.token_ids)
                r["passes"] += greedy.stats["target_forward_passes"] if method != "diffusion" else passes(greedy)
                r["wall"] += wall
                r["d3"][0].append(q["distinct_3"])
                r["rep"][0].append(q["repeat_rate"])
                if args.show and label in (args.show, "autoregressive"):
                    print(f"[{i + 1} {label}] {greedy.text!r}", flush=True)
                if not args.no_sample:
                    sample, _ = decode(models, method, prompt, max_new_tokens=n, temperature=1.0, seed=i, **options)
                    q = score_quality(models, sample)
                    r["ppl"].append(q["perplexity"])
                    r["d3"][1].append(q["distinct_3"])
                    r["rep"][1].append(q["repeat_rate"])
            print(f"N={n}: prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
        ar = rows["autoregressive"]
        print(f"\n## N = {n}, blocks of {block}, {len(prompts)} held-out prompts, {args.threads} thread(s), "
              f"precision {models.precision}")
        print("| setting | tokens / pass | wall vs AR | perplexity T=1 (median) | distinct-3 (T=0 / T=1) | "
              "adjacent repeats (T=0 / T=1) |")
        print("|---|---|---|---|---|---|")
        for label, r in rows.items():
            ppl = f"{statistics.median(r['ppl']):.2f}" if r["ppl"] else "–"
            print(f"| {label} | {r['tok'] / max(1, r['passes']):.2f} | {r['wall'] / ar['wall']:.2f} | {ppl} | "
                  f"{mean(r['d3'][0]):.3f} / {mean(r['d3'][1]):.3f} | "
                  f"{mean(r['rep'][0]):.4f} / {mean(r['rep'][1]):.4f} |", flush=True)


if __name__ == "__main__":
    main()
