"""Does the smollm2-135m diffusion model lose anything in bfloat16 or int8? Teacher-forced, so sampling noise
cannot hide it.

    python benchmarks/diffusion_dtype.py [--limit 12] [--tokens 64] [--formats bfloat16,int8] [--threshold 0.9]

For each held-out chat prompt the target's greedy answer is masked at rate t (seeded, the same masks for both
dtypes) and the denoiser predicts the masked tokens in one pass: mean cross-entropy (nats per masked token) in
float32 and in each other format (``--formats``: bfloat16 through torch, or int8 / bfloat16-weights on the
target's kernels, as an exact precision runs it), and how often each agrees with float32 on the argmax. Then one
diffusion decode per prompt in each format (K = N, and threshold decoding with ``--threshold``; blocks of 8,
greedy), timed interleaved: the latency ratios on this CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2_card import diffusion_in, heldout  # noqa: E402

import explorer  # noqa: E402
from explorer.decoding.api import encode_prompt  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.models import cpu_has_native_bf16  # noqa: E402

RATES = (0.25, 0.5, 0.75)


def side(models, name: str):
    """The float32 diffusion model, or a copy in bfloat16 (torch) or on the target's kernels in int8 /
    bfloat16-weights (``use_kernels_in_diffusion``: what an exact precision runs)."""
    return models.diffusion if name == "float32" else diffusion_in(name, models.diffusion)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--formats", default="bfloat16", help="compared with float32: bfloat16 (torch), int8, "
                    "bfloat16-weights (the kernels)")
    ap.add_argument("--threshold", type=float, default=None, help="also time threshold decoding (Fast-dLLM)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = explorer.load_models("smollm2-135m", device="cpu", dtype="float32")  # every model in float32
    sides = {name: side(models, name) for name in ["float32", *args.formats.split(",")]}
    others = list(sides)[1:]
    prompts = heldout(args.limit)
    print(f"cpu: {cpu_name()}, native bf16: {cpu_has_native_bf16()}; 1 torch thread; {len(prompts)} held-out prompts")
    ce = {(name, t): [] for name in sides for t in RATES}
    agree = {(name, t): [] for name in others for t in RATES}
    for i, prompt in enumerate(prompts):
        ids, _ = encode_prompt(models.tokenizer, prompt, True)
        answer = explorer.decode("autoregressive", models, prompt, max_new_tokens=args.tokens).token_ids
        x0, p = torch.tensor(ids + answer), len(ids)
        for t in RATES:
            masked = torch.rand(len(answer), generator=torch.Generator().manual_seed(i)) < t
            masked[0] = True
            xt = x0.clone()
            xt[p:][masked] = models.mask_token_id
            where = p + masked.nonzero()[:, 0]
            top = {}
            for name, model in sides.items():
                with torch.inference_mode():
                    logits = model(xt[None]).logits[0, where - 1].float()  # shifted: position j-1 predicts j
                ce[(name, t)].append(float(F.cross_entropy(logits, x0[where])))
                top[name] = logits.argmax(-1)
            for name in others:
                agree[(name, t)].append(float((top["float32"] == top[name]).float().mean()))
    print("\n| mask rate t | " + " | ".join(f"cross-entropy {n}" for n in sides) + " | " +
          " | ".join(f"argmax agreement {n} / float32" for n in others) + " |")
    print("|---" * (1 + len(sides) + len(others)) + "|")
    for t in RATES:
        print(f"| {t} | " + " | ".join(f"{statistics.mean(ce[(n, t)]):.3f}" for n in sides) + " | " +
              " | ".join(f"{statistics.mean(agree[(n, t)]):.3f}" for n in others) + " |")
    schedules = [("K = N", {})] + ([(f"threshold {args.threshold}", {"threshold": args.threshold})]
                                   if args.threshold else [])
    for model in sides.values():  # warm-up
        explorer.decode("diffusion", dataclasses.replace(models, diffusion=model), prompts[0], max_new_tokens=8,
                        steps=8, block_length=8)
    for label, extra in schedules:
        lat, passes = {name: [] for name in sides}, {name: 0 for name in sides}
        same = {name: 0 for name in others}
        kw = dict(max_new_tokens=args.tokens, steps=args.tokens, block_length=8, **extra)
        for prompt in prompts:
            out = {}
            for name, model in sides.items():
                start = time.perf_counter()
                out[name] = explorer.decode("diffusion", dataclasses.replace(models, diffusion=model), prompt, **kw)
                lat[name].append(time.perf_counter() - start)
                passes[name] += out[name].stats["denoiser_passes"]
            for name in others:
                same[name] += out["float32"].token_ids == out[name].token_ids
        f32 = statistics.median(lat["float32"])
        print(f"\ndiffusion decode, N = {args.tokens}, {label}, blocks of 8, greedy, interleaved "
              f"(median seconds per answer; passes per answer; identical output to float32):")
        for name in sides:
            s_ = statistics.median(lat[name])
            tail = "" if name == "float32" else f"; {f32 / s_:.2f}x float32; identical on {same[name]}/{len(prompts)}"
            print(f"- {name}: {s_:.2f} s, {passes[name] / len(prompts):.1f} passes{tail}")


if __name__ == "__main__":
    main()
