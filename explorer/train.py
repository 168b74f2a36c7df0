"""Train the embedded ``tiny`` model family from scratch (CPU, fixed seeds).

    python -m explorer.train [--out assets/models/tiny] [--budget-target-min 28]
        [--budget-draft-min 10] [--budget-diffusion-min 18] [--mini]

Pipeline (each stage moved into ``out`` atomically once it is complete):

1. corpus    -- the CPython standard library of the running interpreter, split
                train / held-out by a hash of each file's relative path;
2. tokenizer -- byte-level BPE (vocab 8192) with ``<|endoftext|>``, ``<|pad|>``,
                ``<|mask|>``; no special token is ever added by ``tokenizer(text)``;
3. target    -- a small autoregressive ``LlamaForCausalLM``;
4. draft     -- a much smaller Llama distilled from the target with KL(target||draft)
                (Hinton et al. 2015 "Distilling the knowledge in a neural network";
                DistillSpec, Zhou et al. 2023);
5. diffusion -- the target's weights adapted into a bidirectional masked-diffusion
                model with shifted logits (Dream 7B, Ye et al. 2025; DiffuLLaMA,
                Gong et al. 2024), trained with the MDLM / LLaDA objective
                (Sahoo et al. 2024; Nie et al. 2025).

``train_report.json`` records the corpus, configs, parameter counts, FLOPs, wall
time, held-out losses, draft/target agreement and forward latencies. The stages live in
``explorer/training/tiny/``: corpus (1, 2), recipes (3-5), evaluation, pipeline (saving, the report).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from explorer.training import smollm2
from explorer.training.tiny.pipeline import DEFAULT_OUT, remeasure_latency, train_all


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--budget-target-min", type=float, default=28)
    p.add_argument("--budget-draft-min", type=float, default=10)
    p.add_argument("--budget-diffusion-min", type=float, default=18)
    p.add_argument("--mini", action="store_true", help="tiny sizes on a corpus slice (seconds)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for training")
    p.add_argument("--latency-only", action="store_true",
                   help="re-measure latencies of the saved models and update the report")
    return p.parse_args(argv)


def main(argv=None) -> None:
    """Entry point of ``python -m explorer.train`` (``... train smollm2 STAGE`` for the SmolLM2 family)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["smollm2"]:
        smollm2.main(argv[1:])
        return
    args = parse_args(argv)
    if args.latency_only:
        print(json.dumps(remeasure_latency(args.out), indent=2))
        return
    budgets = {"target": args.budget_target_min, "draft": args.budget_draft_min,
               "diffusion": args.budget_diffusion_min}
    report = train_all(args.out, mini=args.mini, budgets_min=budgets, threads=args.threads)
    summary = {k: report.get(k) for k in ("heldout_ar", "latency_ms", "weights_mb")}
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
