"""The numbers in assets/models/smollm2-135m/README.md, on held-out chat prompts (unseen topics).

    python benchmarks/smollm2_card.py [--limit 12] [--threads 1] [--tokens 64] [--samples] [--drafters assistant,model]
        [--diffusion-dtypes float32,bfloat16]

1. Speculative decoding (the EAGLE head and the trimmed-head draft, temperature 0) against autoregressive, timed
   interleaved per prompt (AR, spec, AR, spec, ...): tokens per target pass, acceptance, the
   draft/target cost ratio c, and the speedup for each gamma; prompt lookup and early exit beside.
2. Acceptance at temperature 0.7 (seeded).
3. Diffusion quality at N = 64 next to the target's own temperature-1 samples: generative
   perplexity under the target, token entropy and the distinct 3-gram ratio (EOS ignored: fixed
   length, as vLLM's --ignore-eos). ``--samples`` prints twelve outputs of each side by side.
4. The diffusion KV cache (none | prefix | dual) at K = N: speedup, token agreement with none, quality.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.measure.workload import distinct_ngram_ratio, ignoring_eos, score_quality  # noqa: E402
from explorer.training.prompts import chat_prompts  # noqa: E402


def heldout(limit: int) -> list[str]:
    """Half Python tasks, half general questions, all on topics no training prompt mentions."""
    rows = chat_prompts("heldout")
    python = [r["prompt"] for r in rows if r["kind"] == "python"]
    general = [r["prompt"] for r in rows if r["kind"] == "general"]
    return [p for pair in zip(python, general, strict=False) for p in pair][:limit]


def speculative_table(models, prompts, gammas, tokens, drafters=("model",)):
    for prompt in prompts[:2]:  # warm-up
        explorer.decode("speculative", models, prompt, max_new_tokens=8)
        explorer.decode("autoregressive", models, prompt, max_new_tokens=8)
    print(f"\n## Speculative vs autoregressive (temperature 0, {tokens} new tokens, {len(prompts)} held-out prompts)")
    print("| drafter | gamma | tokens / target pass | acceptance | c (draft pass / target pass) | "
          "speedup (interleaved) | per-prompt speedup, median [min, max] |")
    print("|---|---|---|---|---|---|---|")
    for drafter in drafters:
        for item in gammas:  # "6" = a chain of 6; "6@0.15" = up to 6, cut where the draft's probability < 0.15
            gamma, _, cut = str(item).partition("@")
            gamma, cut = int(gamma), float(cut) if cut else None
            ar_s = spec_s = 0.0
            passes = new = accepted = proposed = 0
            draft_s = draft_n = target_s = target_n = 0.0
            per_prompt = []
            for prompt in prompts:
                ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=tokens)
                spec = explorer.decode("speculative", models, prompt, max_new_tokens=tokens, gamma=gamma,
                                       drafter=drafter, draft_confidence=cut)
                assert spec.token_ids == ar.token_ids, prompt
                ar_s, spec_s = ar_s + ar.stats["wall_s"], spec_s + spec.stats["wall_s"]
                per_prompt.append(ar.stats["wall_s"] / spec.stats["wall_s"])
                passes += spec.stats["target_forward_passes"]
                new += spec.stats["new_tokens"]
                accepted += spec.stats["accepted"]
                proposed += spec.stats["proposed"]
                draft_s += spec.stats["draft_forward_s"]
                draft_n += spec.stats["draft_forward_passes"]
                target_s += ar.stats["target_forward_s"]
                target_n += ar.stats["target_forward_passes"]
            c = (draft_s / draft_n) / (target_s / target_n) if draft_n else float("nan")
            shown = f"up to {gamma}, cut below {cut}" if cut else str(gamma)
            print(f"| {drafter} | {shown} | {new / passes:.2f} | {accepted / max(1, proposed):.3f} | {c:.3f} | "
                  f"{ar_s / spec_s:.2f}x | {statistics.median(per_prompt):.2f}x "
                  f"[{min(per_prompt):.2f}, {max(per_prompt):.2f}] |")


def sampled_acceptance(models, prompts, tokens, gamma, drafter, temperature=0.7):
    acc = prop = passes = new = 0
    for i, prompt in enumerate(prompts):
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=tokens, gamma=gamma,
                               temperature=temperature, seed=i, drafter=drafter)
        acc, prop = acc + spec.stats["accepted"], prop + spec.stats["proposed"]
        passes, new = passes + spec.stats["target_forward_passes"], new + spec.stats["new_tokens"]
    print(f"\n## Temperature {temperature}, drafter {drafter}, gamma {gamma}: acceptance {acc / prop:.3f}, "
          f"{new / passes:.2f} tokens per target pass ({len(prompts)} prompts, seeded)")


def cache_table(models, prompts, lengths, block):
    """Diffusion with the Fast-dLLM cache against none: speed (interleaved), token agreement, quality."""
    fixed = ignoring_eos(models)
    print(f"\n## Diffusion KV cache (K = N, blocks of {block}, temperature 0, EOS ignored, {len(prompts)} prompts)")
    print("| N | cache | latency ms, median | speedup vs none | token agreement with none | "
          "perplexity, median | entropy (bits), mean |")
    print("|---|---|---|---|---|---|---|")
    for n in lengths:
        rows = {c: {"s": 0.0, "lat": [], "ppl": [], "ent": [], "agree": []} for c in ("none", "prefix", "dual")}
        for prompt in prompts:
            ref = None
            for cache in ("none", "prefix", "dual"):  # interleaved per prompt
                trace = explorer.decode("diffusion", fixed, prompt, max_new_tokens=n, steps=n, block_length=block,
                                        cache=cache)
                r = rows[cache]
                r["s"] += trace.stats["wall_s"]
                r["lat"].append(trace.stats["wall_s"] * 1e3)
                q = score_quality(models, trace)
                r["ppl"].append(q["perplexity"])
                r["ent"].append(q["token_entropy_bits"])
                ref = ref or trace.token_ids
                r["agree"].append(sum(a == b for a, b in zip(ref, trace.token_ids, strict=False)) / len(ref))
        for cache, r in rows.items():
            print(f"| {n} | {cache} | {statistics.median(r['lat']):.0f} | {rows['none']['s'] / r['s']:.2f}x | "
                  f"{statistics.mean(r['agree']):.3f} | {statistics.median(r['ppl']):.1f} | "
                  f"{statistics.mean(r['ent']):.2f} |")


def diffusion_in(name: str, model=None):
    """A copy of ``model`` (default: the preset's diffusion model as float32 loads it) in ``name``: a torch dtype
    (float32, bfloat16) or an exact precision's weight format on the target's kernels (int8, bfloat16-weights)."""
    from explorer.precision import PRECISIONS  # deferred: only the --diffusion-dtypes rows need it
    from explorer.precision.exact import use_kernels_in_diffusion  # deferred: as above

    model = copy.deepcopy(model or explorer.load_models("smollm2-135m", device="cpu", dtype="float32").diffusion)
    if name in ("float32", "bfloat16"):
        return model.to(getattr(torch, name))
    return use_kernels_in_diffusion(model, PRECISIONS[name])


def diffusion_table(models, prompts, n, block, show_samples, cache=None, dtypes=("default",), ks=None, seeds=1):
    """Rows timed interleaved (prompt outer, rows inner). ``dtypes``: the diffusion model's precision per set of
    rows ("default": as loaded, on the int8 kernels at the default precision; otherwise ``diffusion_in``); ``ks``:
    the diffusion steps (default N and N/2); ``seeds``: samples per prompt (seeds i, i + 1000, ...)."""
    fixed = ignoring_eos(models)
    c = {"cache": cache} if cache else {}
    rows = [("autoregressive, temperature 1", "autoregressive", dict(temperature=1.0), fixed)]
    for name in dtypes:
        side = fixed if name == "default" else dataclasses.replace(fixed, diffusion=diffusion_in(name))
        dt = getattr(side.diffusion, "kernel_format", None)
        dt = f"{dt} weights on the kernels" if dt else str(next(side.diffusion.parameters()).dtype)[6:]
        rows += [(f"diffusion K={k}, blocks of {block}, temperature 1, cache {cache or 'default'}, {dt}", "diffusion",
                  dict(steps=k, block_length=block, temperature=1.0, **c), side) for k in (ks or (n, n // 2))]
    print(f"\n## Quality next to speed (N = {n} new tokens, EOS ignored, {len(prompts)} held-out prompts x {seeds} "
          "seeds, rows interleaved per prompt)")
    print("| decoder | generative perplexity (target as judge), median | token entropy (bits), mean | "
          "distinct 3-grams, mean | latency ms, median | passes |")
    print("|---|---|---|---|---|---|")
    got = {label: {"ppl": [], "ent": [], "dist": [], "lat": [], "passes": [], "texts": []} for label, *_ in rows}
    for _label, method, kw, side in rows:  # warm-up
        explorer.decode(method, side, prompts[0], max_new_tokens=8, seed=0,
                        **{**kw, "steps": 8} if method == "diffusion" else kw)
    for i, prompt in ((i + 1000 * r, p) for r in range(seeds) for i, p in enumerate(prompts)):
        for label, method, kw, side in rows:
            trace = explorer.decode(method, side, prompt, max_new_tokens=n, seed=i, **kw)
            q, g = score_quality(models, trace), got[label]
            g["ppl"].append(q["perplexity"])
            g["ent"].append(q["token_entropy_bits"])
            g["dist"].append(distinct_ngram_ratio(trace.token_ids))
            g["lat"].append(trace.stats["wall_s"] * 1e3)
            g["passes"].append(trace.stats["target_forward_passes"])
            g["texts"].append(trace.text)
    for label, g in got.items():
        print(f"| {label} | {statistics.median(g['ppl']):.1f} | {statistics.mean(g['ent']):.2f} | "
              f"{statistics.mean(g['dist']):.3f} | {statistics.median(g['lat']):.0f} | "
              f"{statistics.median(g['passes']):.0f} |")
    if show_samples:
        ar_label, diff_label = rows[0][0], rows[1][0]
        print(f"\n## Samples: {ar_label} | {diff_label}")
        for prompt, a, d in zip(prompts, got[ar_label]["texts"], got[diff_label]["texts"], strict=False):
            print(f"\n**{prompt}**\n\n- AR: {a!r}\n- diffusion: {d!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gammas", default="1,2,3,4,6",
                    help="comma list; 6@0.15 = up to 6 drafts, cut where the draft's probability falls below 0.15")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--samples", action="store_true", help="print twelve outputs of AR and diffusion")
    ap.add_argument("--cache", default=None, help="diffusion KV cache for the diffusion rows (none|prefix|dual)")
    ap.add_argument("--drafters", default="assistant,model", help="drafters of the gamma table")
    ap.add_argument("--diffusion-dtypes", default="default",
                    help="comma list for the diffusion rows: default (as loaded), float32, bfloat16, int8, "
                    "bfloat16-weights")
    ap.add_argument("--diffusion-ks", default="", help="comma list of diffusion steps K (default N and N/2)")
    ap.add_argument("--seeds", type=int, default=1, help="diffusion table: samples per prompt")
    ap.add_argument("--cache-lengths", default="64,128", help="N of the cache table")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: spec,sampled,others,diffusion,cache")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    start = time.time()
    models = explorer.load_models("smollm2-135m", device="cpu")
    prompts = heldout(args.limit)
    print(f"torch threads {args.threads}; cpu: {cpu_name()}; smollm2-135m loaded in {time.time() - start:.0f} s")
    gammas = args.gammas.split(",")
    drafters = args.drafters.split(",")
    if "spec" not in skip:
        speculative_table(models, prompts, gammas, args.tokens, drafters=drafters)
    if "others" not in skip:
        speculative_table(models, prompts, [4], args.tokens, drafters=("prompt_lookup", "early_exit", "diffusion"))
    if "sampled" not in skip:
        for drafter in drafters:
            sampled_acceptance(models, prompts, args.tokens, models.preset.gamma, drafter)
    if "diffusion" not in skip:
        diffusion_table(models, prompts, args.tokens, args.block, args.samples, args.cache,
                        args.diffusion_dtypes.split(","),
                        [int(k) for k in args.diffusion_ks.split(",") if k] or None, args.seeds)
    if "cache" not in skip:
        cache_table(models, prompts, [int(n) for n in args.cache_lengths.split(",")], args.block)


if __name__ == "__main__":
    main()
