"""Per-step overhead of the decoding loops: wall time not spent inside model forward passes.

    python benchmarks/loop_overhead.py --preset tiny --tokens 64 --repeats 5 [--profile]

Each decode records the synchronized time of every forward pass; the rest of its wall time is
the loop's own overhead (sampling, rejection rule, cache rollback, event building). Reported per
target step for autoregressive and speculative (model drafter), interleaved in one run.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402

PROMPTS = ["def parse(line):", "import os\nimport sys\n\n", "class Node:\n    def __init__(self"]


def overhead_per_step(trace) -> float:
    s = trace.stats
    steps = s["target_forward_passes"]
    return (s["wall_s"] - s["target_forward_s"] - s["draft_forward_s"]) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = explorer.load_models(args.preset, device="cpu")
    runs = {"autoregressive": {}, "speculative": {"drafter": "model"}}
    for method, kw in runs.items():  # warm-up
        explorer.decode(method, models, PROMPTS[0], max_new_tokens=8, **kw)
    results = {m: [] for m in runs}
    totals = {m: [] for m in runs}
    for _ in range(args.repeats):
        for prompt in PROMPTS:
            for method, kw in runs.items():  # interleaved
                trace = explorer.decode(method, models, prompt, max_new_tokens=args.tokens, **kw)
                results[method].append(overhead_per_step(trace))
                totals[method].append(trace.stats["wall_s"] / trace.stats["target_forward_passes"])
    print(f"preset {args.preset}, {args.tokens} new tokens, {args.repeats}x{len(PROMPTS)} decodes each, "
          f"{args.threads} thread(s)")
    for method in runs:
        med = statistics.median(results[method]) * 1e3
        print(f"{method:15s} loop overhead per target step: median {med:.3f} ms "
              f"(step wall time median {statistics.median(totals[method]) * 1e3:.3f} ms)")
    if args.profile:
        for method, kw in runs.items():
            prof = cProfile.Profile()
            prof.enable()
            for prompt in PROMPTS:
                explorer.decode(method, models, prompt, max_new_tokens=args.tokens, **kw)
            prof.disable()
            print(f"\n--- {method}: top functions by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
