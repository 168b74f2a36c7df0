"""Speed of each precision on the default preset, and whether greedy speculative still equals autoregressive.

    python benchmarks/precision_speed.py [--prompts 6] [--tokens 64] [--gamma 3] [--reps 9]

One torch thread. The float32 bundle is loaded once (``load_models("smollm2-135m", precision="float32")``); each
exact precision is a copy converted by ``converted_copy``, which applies what ``load_models`` applies (the target
row-invariant, the EAGLE head on the same kernels). Held-out chat prompts (``chat_prompts("heldout")``), and per
prompt every precision in turn (interleaved), greedy autoregressive then greedy speculative (the preset's drafter,
the EAGLE head). Then the
verify-pass cost: a pass over gamma + 1 new tokens against a one-token pass, over a 120-token prefix, medians
of --reps taken in turn. Other work on the machine slows everything: compare the ratios, not the tokens/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from benchmarks.paired import ar_and_spec  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.precision import EXACT, PRECISIONS, converted_copy  # noqa: E402
from explorer.training.prompts import chat_prompts  # noqa: E402


def bundles(names: list[str]) -> dict:
    base = explorer.load_models("smollm2-135m", device="cpu", precision="float32")
    return {name: converted_copy(base, name) for name in names}


def pass_times(models, rows: int, reps: int) -> list[float]:
    """Seconds of one target pass over ``rows`` new tokens after a 120-token prefix, ``reps`` times."""
    from transformers import DynamicCache

    prompt = torch.randint(100, 5000, (1, 120 + rows), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache()
    with torch.inference_mode():
        models.target(prompt[:, :120], past_key_values=cache, use_cache=True)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            models.target(prompt[:, 120:], past_key_values=cache, use_cache=True, logits_to_keep=rows)
            times.append(time.perf_counter() - start)
            cache.crop(-rows)
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    names = args.precisions.split(",")
    load_start = os.getloadavg()
    models = bundles(names)
    prompts = [row["prompt"] for row in chat_prompts("heldout")[:args.prompts]]
    rows = ar_and_spec({n: models[n] for n in names}, prompts, args.tokens, args.gamma)
    verify = {n: ([], []) for n in names}
    for _ in range(3):  # rounds, each precision in turn
        for name in names:
            verify[name][0].extend(pass_times(models[name], 1, args.reps))
            verify[name][1].extend(pass_times(models[name], args.gamma + 1, args.reps))
    fp32_ar = rows[names[0]]["ar_tokens"] / rows[names[0]]["ar_s"]
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs, 1 torch thread; load average at start "
          f"{load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f} (other work shares this machine)")
    print(f"{len(prompts)} held-out chat prompts, {args.tokens} new tokens, gamma {args.gamma}, drafter: the preset's "
          f"({models[names[0]].preset.drafter}); ratios against {names[0]} autoregressive")
    print("| precision | exact | AR tok/s | AR / float32 AR | spec tok/s | spec / own AR | one-row pass ms | "
          f"{args.gamma + 1}-row pass / one-row | greedy spec == AR |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = rows[name]
        ar_rate, spec_rate = r["ar_tokens"] / r["ar_s"], r["spec_tokens"] / r["spec_s"]
        one, many = statistics.median(verify[name][0]), statistics.median(verify[name][1])
        print(f"| {name} | {'yes' if name in EXACT else 'no'} | {ar_rate:.1f} | {ar_rate / fp32_ar:.2f}x | "
              f"{spec_rate:.1f} | {spec_rate / ar_rate:.2f}x | {one * 1e3:.1f} | {many / one:.2f} | "
              f"{r['equal']}/{len(prompts)} |")


if __name__ == "__main__":
    main()
