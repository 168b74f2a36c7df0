"""What a verify pass costs against a one-token pass, for the smollm2-135m target in float32, bfloat16 and torch's
dynamic int8, and whether dynamic int8 keeps greedy speculative decoding equal to greedy autoregressive decoding.

    python benchmarks/verify_cost.py [--reps 12] [--prompts 8] [--skip-timing]

One torch thread; a 120-token prompt in the KV cache, then one pass over M new tokens (M = 1 is an
autoregressive step, M = gamma + 1 a verify pass), median of --reps. The dtypes are timed in turn, float32 twice
(first and last) to show the drift. Then the whole preset in bfloat16 (``load_models(dtype="bfloat16")``): greedy
speculative (EAGLE head, gamma 3) against greedy autoregressive on held-out prompts, interleaved: how often the
outputs are equal, the speedup and tokens per pass.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.models import cpu_has_native_bf16  # noqa: E402

ROWS = (1, 2, 4, 5, 8)


def pass_times(model, reps: int) -> dict[int, float]:
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 5000, (1, 120), generator=gen)
    out = {}
    with torch.inference_mode():
        for m in ROWS:
            times = []
            for _ in range(reps):
                cache = DynamicCache()
                model(prompt, past_key_values=cache, use_cache=True)
                new = torch.randint(100, 5000, (1, m), generator=gen)
                start = time.perf_counter()
                model(new, past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - start)
            out[m] = statistics.median(times)
    return out


def int8_dynamic(model):
    import torch.ao.quantization as q

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        return q.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear: q.per_channel_dynamic_qconfig},
                                  dtype=torch.qint8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--skip-timing", action="store_true", help="only the bfloat16 preset's speculative check")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.skip_timing:
        timing(args.reps)
    bf16_preset(args.prompts)


def bf16_preset(limit: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from smollm2_card import heldout

    models = explorer.load_models("smollm2-135m", device="cpu", dtype="bfloat16")
    prompts = heldout(limit)
    explorer.decode("speculative", models, prompts[0], max_new_tokens=8, drafter="assistant")  # warm-up
    equal, ar_s, spec_s, per_pass = 0, 0.0, 0.0, []
    for prompt in prompts:
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=64)
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=64, gamma=3, drafter="assistant")
        equal += ar.token_ids == spec.token_ids
        ar_s, spec_s = ar_s + ar.stats["wall_s"], spec_s + spec.stats["wall_s"]
        per_pass.append(spec.stats["new_tokens"] / spec.stats["target_forward_passes"])
    print(f"\nthe whole preset in bfloat16, greedy, 64 tokens, {len(prompts)} held-out prompts, EAGLE head at gamma 3: "
          f"speculative == autoregressive on {equal} of {len(prompts)}; speedup {ar_s / spec_s:.2f}x; "
          f"{statistics.mean(per_pass):.2f} tokens per target pass")


def timing(reps: int) -> None:
    models = explorer.load_models("smollm2-135m", device="cpu", dtype="float32")
    variants = {"float32": models.target, "bfloat16": copy.deepcopy(models.target).to(torch.bfloat16),
                "int8 dynamic": int8_dynamic(models.target)}
    print(f"cpu: {cpu_name()}, native bf16: {cpu_has_native_bf16()}; 1 torch thread")
    print("\n| target | " + " | ".join(f"{m} token{'s' if m > 1 else ''}" for m in ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    for name in [*variants, "float32"]:
        t = pass_times(variants[name], reps)
        print(f"| {name} | " + " | ".join(f"{t[m] * 1e3:.1f} ms ({t[m] / t[1]:.2f}x)" for m in ROWS) + " |")
    # the float32 EAGLE head drafts (any drafter would do: greedy output depends only on the target's logits)
    quantized = dataclasses.replace(models, target=variants["int8 dynamic"])
    prompt = "Write a Python function that checks whether a list is sorted."
    ar = explorer.decode("autoregressive", quantized, prompt, max_new_tokens=48)
    spec = explorer.decode("speculative", quantized, prompt, max_new_tokens=48, gamma=3, drafter="assistant")
    same = next((i for i, (a, b) in enumerate(zip(ar.token_ids, spec.token_ids, strict=False)) if a != b), None)
    print(f"\nint8 dynamic target, greedy, 48 tokens, EAGLE head at gamma 3: speculative == autoregressive: "
          f"{spec.token_ids == ar.token_ids}" + (f" (first difference at token {same})" if same is not None else ""))


if __name__ == "__main__":
    main()
