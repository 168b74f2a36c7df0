"""Audit verdicts for the real sampler and each known sampler bug (injected) on a few prompts.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/audit_verdicts.py [--preset tiny] [--samples N]

Each audit runs at its default sample count (as many as make every known bug detectable with
probability 0.99) unless --samples is given. Prints one markdown table (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from audit_bugs import INJECT  # noqa: E402

import explorer  # noqa: E402
from explorer.measure import audit  # noqa: E402

CASES = [
    ("import os\n", dict(temperature=1.0, top_k=2, gamma=3)),  # the test's case
    ("def merge_sorted(left, right):\n", dict(temperature=1.0, top_k=8, gamma=3)),  # the case
    ("class Stack:\n    def", dict(temperature=0.7, top_k=8, gamma=3)),
    ("def parse(line):", dict(temperature=1.0, gamma=3)),  # no top-k: 8192 outcomes, first token only
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--cases", type=int, default=len(CASES), help="run the first N cases")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = explorer.load_models(args.preset, device="cpu")
    print("| prompt, options | sampler | samples | verdict | p first token | p two tokens | TV first token "
          "(spec vs exact) | min detectable TV | TV of the bugs here (no_residual / q_before_warping / "
          "bonus_from_draft) | s |\n|---|---|---|---|---|---|---|---|---|---|")
    for prompt, options in CASES[:args.cases]:
        for bug in [None, *INJECT]:
            with pytest.MonkeyPatch.context() as mp:
                if bug:
                    INJECT[bug](mp)
                start = time.perf_counter()
                r = audit.run_audit(models, prompt, samples=args.samples, **options)
            joint = "-" if r.exact_joint_p_value is None else f"{r.exact_joint_p_value:.2g}"
            tvs = " / ".join(f"{b['tv_here']:.3f}" for b in r.bugs)
            opts = ", ".join(f"{k}={v}" for k, v in options.items())
            print(f"| `{prompt!r}` {opts} | {bug or 'real'} | {r.samples} | {r.status} | "
                  f"{r.exact_first_p_value:.2g} | {joint} | {r.first_token_tv_exact_spec:.3f} | "
                  f"{r.min_detectable_tv:.3f} | {tvs} | {time.perf_counter() - start:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
