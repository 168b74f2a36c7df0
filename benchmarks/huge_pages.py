"""The default preset's int8 target with its kernel weights in 2 MB pages (as ``make_row_invariant`` leaves them)
against a copy whose weights sit where torch allocates them (4 KB pages), timed pass by pass in turn in one process.

    python benchmarks/huge_pages.py [--threads 1] [--rows 4] [--rounds 12]
    EXPLORER_NO_AMX=1 EXPLORER_KERNEL_ISA=avx2 python benchmarks/huge_pages.py

Each round times a one-token and a ``rows``-token pass after a 32-token prefix (``precision.choice.pass_ms``, 5
repeats) on each copy, the order alternating; prints the median ms per copy and the ratio. Both copies give the
same logits (checked).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.precision import choice, kernels  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = explorer.load_models("smollm2-135m@int8")
    huge = models.target
    plain = copy.deepcopy(huge)  # a deep copy's tensors are torch's own allocations
    weight = huge.model.layers[0].attention.qkv.kernel_weight
    assert weight.untyped_storage().data_ptr() != plain.model.layers[0].attention.qkv.kernel_weight.data_ptr()
    ids = torch.arange(3, 40)[None]
    with torch.inference_mode():
        assert torch.equal(huge(ids).logits, plain(ids).logits)
    times = {name: ([], []) for name in ("2 MB pages", "4 KB pages")}
    for r in range(args.rounds):
        order = [("2 MB pages", huge), ("4 KB pages", plain)]
        for name, model in order if r % 2 == 0 else order[::-1]:
            one, many = choice.pass_ms(model, args.rows, reps=5)
            times[name][0].append(one)
            times[name][1].append(many)
    print(f"{cpu_name()}; path {kernels.chosen_isa()}; {args.threads} thread(s); median of {args.rounds} rounds")
    print(f"| weights | 1-token pass | {args.rows}-token pass |\n|---|---|---|")
    med = {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in times.items()}
    for name, (one, many) in med.items():
        print(f"| {name} | {one:.2f} ms | {many:.2f} ms |")
    (h1, hk), (p1, pk) = med["2 MB pages"], med["4 KB pages"]
    print(f"4 KB / 2 MB: {p1 / h1:.3f} (1 token), {pk / hk:.3f} ({args.rows} tokens)")


if __name__ == "__main__":
    main()
