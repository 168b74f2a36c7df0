"""What the EAGLE head's vocabulary costs: the same head shipped with fewer kept tokens, at the default precision.

    python benchmarks/head_vocab.py HEAD_FOLDER [HEAD_FOLDER ...] [--prompts 6] [--tokens 64] [--gamma 3]

Each HEAD_FOLDER is an exported head (``python -m explorer.train smollm2 export --keep-vocab K``: the K most
frequent of the tokens it trained with). A drafting step ends in the head's LM head over its kept tokens (16,384
rows of 576 as the head was trained: most of the step), so fewer rows make each step cheaper while the tokens it can no
longer propose cost acceptance. One torch thread; the preset loaded once in float32 and one copy per head converted
to the default precision as ``load_models`` converts it (the target row-invariant, the head on the same kernels).
Held-out chat prompts; per prompt every head in turn (interleaved), greedy autoregressive then greedy speculative.
Reports tokens per target pass, the time of one drafting step, speculative / autoregressive and whether greedy
speculative output equals autoregressive. Other work on the machine slows everything: compare the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from explorer.families.eagle import load_eagle_head  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.precision import FASTEST_EXACT, converted_copy  # noqa: E402
from explorer.training.prompts import chat_prompts  # noqa: E402


def step_seconds(models, reps: int = 30) -> float:
    """Median seconds of one drafting step of the head (its layer on one row, then its logits), cache warm."""
    head = models.assistant
    feats = torch.randn(1, 1, head.config.hidden_size)
    ids = torch.tensor([[1000]])
    times = []
    with torch.inference_mode():
        _, cache = head.step(ids, feats, 0, None)
        for _ in range(reps):
            start = time.perf_counter()
            out, _ = head.step(ids, feats, 1, [c.clone() for c in cache] if cache else None)
            head.full_logits(out[0, -1]).argmax(-1)  # as the drafter does: the full row, -inf off the kept set
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("heads", nargs="+", type=Path)
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--precision", default=FASTEST_EXACT)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    base = explorer.load_models("smollm2-135m", device="cpu", precision="float32")
    bundles = {}
    for folder in args.heads:
        head = load_eagle_head(folder, base.target, torch.float32)
        bundles[folder] = converted_copy(dataclasses.replace(base, assistant=head), args.precision)
    prompts = [row["prompt"] for row in chat_prompts("heldout")[:args.prompts]]
    rows = ar_and_spec(bundles, prompts, args.tokens, args.gamma)
    steps = {f: [] for f in args.heads}
    for _ in range(3):  # rounds, each head in turn
        for folder, models in bundles.items():
            steps[folder].append(step_seconds(models))
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs, 1 torch thread, precision {args.precision}; load average at "
          f"start {load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f} (other work shares this machine)")
    print(f"{len(prompts)} held-out chat prompts, {args.tokens} new tokens, gamma {args.gamma}, greedy")
    print("| head | kept tokens | tokens per target pass | drafting step ms | AR tok/s | spec tok/s | spec / AR "
          "| greedy spec == AR |")
    print("|---|---|---|---|---|---|---|---|")
    for folder, models in bundles.items():
        r = rows[folder]
        ar_rate, spec_rate = r["ar_tokens"] / r["ar_s"], r["spec_tokens"] / r["spec_s"]
        print(f"| {folder} | {len(models.assistant.kept_ids)} | {r['spec_tokens'] / r['passes']:.2f} | "
              f"{statistics.median(steps[folder]) * 1e3:.2f} | {ar_rate:.1f} | {spec_rate:.1f} | "
              f"{spec_rate / ar_rate:.2f}x | {r['equal']}/{len(prompts)} |")


if __name__ == "__main__":
    main()
