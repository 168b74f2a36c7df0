"""Does the smollm2-135m diffusion model lose anything in bfloat16? Teacher-forced, so sampling noise cannot hide it.

    python benchmarks/diffusion_dtype.py [--limit 12] [--tokens 64]

For each held-out chat prompt the target's greedy answer is masked at rate t (seeded, the same masks for both
dtypes) and the denoiser predicts the masked tokens in one pass: mean cross-entropy (nats per masked token) in
float32 and in bfloat16, and how often the two agree on the argmax. Then one diffusion decode per prompt in each
dtype (K = N, blocks of 8, greedy), timed interleaved: the latency ratio on this CPU.
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2_card import heldout  # noqa: E402

import explorer  # noqa: E402
from explorer.decoding.api import encode_prompt  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.models import cpu_has_native_bf16  # noqa: E402

RATES = (0.25, 0.5, 0.75)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = explorer.load_models("smollm2-135m", device="cpu", dtype="float32")  # every model in float32
    sides = {"float32": models.diffusion, "bfloat16": copy.deepcopy(models.diffusion).to(torch.bfloat16)}
    prompts = heldout(args.limit)
    print(f"cpu: {cpu_name()}, native bf16: {cpu_has_native_bf16()}; 1 torch thread; {len(prompts)} held-out prompts")
    ce = {(name, t): [] for name in sides for t in RATES}
    agree = {t: [] for t in RATES}
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
            agree[t].append(float((top["float32"] == top["bfloat16"]).float().mean()))
    print("\n| mask rate t | cross-entropy float32 | cross-entropy bfloat16 | argmax agreement |\n|---|---|---|---|")
    for t in RATES:
        print(f"| {t} | {statistics.mean(ce[('float32', t)]):.3f} | {statistics.mean(ce[('bfloat16', t)]):.3f} | "
              f"{statistics.mean(agree[t]):.3f} |")
    lat = {name: [] for name in sides}
    same = 0
    kw = dict(max_new_tokens=args.tokens, steps=args.tokens, block_length=8)
    for model in sides.values():  # warm-up
        explorer.decode("diffusion", dataclasses.replace(models, diffusion=model), prompts[0], max_new_tokens=8,
                        steps=8, block_length=8)
    for prompt in prompts:
        out = {}
        for name, model in sides.items():
            start = time.perf_counter()
            out[name] = explorer.decode("diffusion", dataclasses.replace(models, diffusion=model), prompt, **kw)
            lat[name].append(time.perf_counter() - start)
        same += out["float32"].token_ids == out["bfloat16"].token_ids
    f32, b16 = statistics.median(lat["float32"]), statistics.median(lat["bfloat16"])
    print(f"\ndiffusion decode, N = K = {args.tokens}, blocks of 8, greedy, interleaved: median {f32:.2f} s float32, "
          f"{b16:.2f} s bfloat16 ({f32 / b16:.2f}x); identical output on {same} of {len(prompts)} prompts")


if __name__ == "__main__":
    main()
