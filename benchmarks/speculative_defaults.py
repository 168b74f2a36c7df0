"""The default preset's speculative lane at the defaults this machine chose, against its own autoregressive decoding,
at each thread count, beside every setting the chooser weighed.

    EXPLORER_KERNEL_ISA=avx2 python benchmarks/speculative_defaults.py [--prompts 6] [--tokens 48] [--threads 1,2]

``load_models()`` as a user gets it (the precision and the speculative defaults measured at one thread on a first
load, then cached); then per thread count, the defaults a decode at that count runs with
(``precision.choice.speculative_defaults``: measured the first time, a few seconds) and, per held-out chat prompt in
turn (interleaved), greedy autoregressive, greedy speculative at those defaults, and the chooser's candidates (the
preset's own setting, chains of 1, 2 and 3). The prompts are chat.txt's after the ones the chooser decodes. Prints a
line per prompt and a table per thread count: tokens/s, speedup over autoregressive, outputs equal to autoregressive.
Compare ratios, not tokens/s: other work on the machine slows every column.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.precision import choice, kernels  # noqa: E402
from explorer.precision.choice import SpeculativeChoice, spec_candidates  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    start = time.perf_counter()
    models = explorer.load_models()
    print(f"{cpu_name()}; kernel path {kernels.chosen_isa()}; load_models() {time.perf_counter() - start:.1f} s",
          flush=True)
    base = models.speculative_choice
    if base is None:
        raise SystemExit("the preset's speculative defaults were not measured here (no exact precision chosen)")
    skip = choice.SPEC_PROMPTS
    prompts = choice.heldout_prompts(skip + args.prompts)[skip:]
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        start = time.perf_counter()
        chosen = choice.speculative_defaults(models, threads)
        print(f"\n{threads} thread(s): {chosen.line()} ({time.perf_counter() - start:.1f} s to read or measure)")
        settings = {"defaults": {}} | {SpeculativeChoice.label(g, c): {"gamma": g, "draft_confidence": c}
                                       for g, c in spec_candidates(*base.own)}
        rows = {name: [0, 0.0, 0] for name in ["autoregressive", *settings]}  # tokens, seconds, equal
        for i, prompt in enumerate(prompts):
            ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=args.tokens)
            rows["autoregressive"][0] += ar.stats["new_tokens"]
            rows["autoregressive"][1] += ar.stats["wall_s"]
            line = [f"AR {ar.stats['tokens_per_s']:.1f}"]
            for name, options in settings.items():
                spec = explorer.decode("speculative", models, prompt, max_new_tokens=args.tokens, **options)
                rows[name][0] += spec.stats["new_tokens"]
                rows[name][1] += spec.stats["wall_s"]
                rows[name][2] += spec.token_ids == ar.token_ids
                line.append(f"{name} {spec.stats['tokens_per_s']:.1f}")
            print(f"prompt {i + 1}/{len(prompts)} tok/s: " + ", ".join(line), flush=True)
        ar_speed = rows["autoregressive"][0] / rows["autoregressive"][1]
        print(f"| {threads} thread(s) | tok/s | x autoregressive | greedy equal to AR |\n|---|---|---|---|")
        for name, (tokens, seconds, equal) in rows.items():
            shown = f"defaults ({SpeculativeChoice.label(chosen.gamma, chosen.draft_confidence)})" \
                if name == "defaults" else name
            same = "–" if name == "autoregressive" else f"{equal}/{len(prompts)}"
            print(f"| {shown} | {tokens / seconds:.1f} | {tokens / seconds / ar_speed:.2f} | {same} |")


if __name__ == "__main__":
    main()
