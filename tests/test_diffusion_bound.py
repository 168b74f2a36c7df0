"""benchmarks/diffusion_bound.py: the beam's marginals against brute force on a random miniature, and the two pass
counts at the thresholds where the answer is known (the model card's bound on threshold decoding rests on them)."""

import importlib.util
import itertools
from pathlib import Path

import pytest
import torch

from explorer.families.random_tiny import build_random_llama

spec = importlib.util.spec_from_file_location(
    "diffusion_bound", Path(__file__).resolve().parent.parent / "benchmarks" / "diffusion_bound.py")
bound = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bound)

V = 6


@pytest.fixture(scope="module")
def model():
    return build_random_llama(vocab_size=V, hidden=32, layers=2, seed=3, std=0.3).eval()


def brute_marginal(model, prefix: list[int], token: int, free: int) -> float:
    """p(x_{j+free} = token | prefix), summing over every one of the V**free fillings of the free positions."""
    total = 0.0
    for path in itertools.product(range(V), repeat=free):
        with torch.no_grad():
            p = model(torch.tensor([prefix + list(path) + [token]])).logits[0].float().softmax(-1)
        seq, n = [*path, token], len(prefix)
        total += float(torch.prod(torch.stack([p[n - 1 + i, t] for i, t in enumerate(seq)])))
    return total


def test_the_beam_marginals_are_exact_with_every_path_and_a_lower_bound_with_fewer(model):
    from transformers import DynamicCache

    prefix, answer = [1, 4, 2], [3, 0, 5, 1]
    cache = DynamicCache()
    p0 = bound.extend(model, cache, prefix)[0]
    exact = [brute_marginal(model, prefix, answer[d], d) for d in (1, 2, 3)]
    full = bound.marginals(model, cache, p0, answer, 0, 3, beam=V ** 3, threshold=0.0)
    assert full == pytest.approx(exact, rel=1e-4)
    narrow = bound.marginals(model, cache, p0, answer, 0, 3, beam=2, threshold=0.0)
    assert all(n <= e + 1e-6 for n, e in zip(narrow, exact, strict=True)) and narrow[0] < exact[0]
    stopped = bound.marginals(model, cache, p0, answer, 0, 3, beam=V ** 3, threshold=1.0)
    assert len(stopped) == 1  # the oracle stops at the first marginal below the threshold


def test_the_pass_counts_at_the_known_thresholds(model):
    prefix, answer, block = [1, 4, 2], [3, 0, 5, 1, 2, 2, 4, 0, 1, 3], 4
    assert bound.oracle(model, None, prefix, answer, block, 0.0, beam=4)[0] == 3  # a block a pass: 4 + 4 + 2
    passes, own = bound.oracle(model, None, prefix, answer, block, 1.0, beam=4)
    assert passes == len(answer) and len(own) == len(answer)  # one token a pass
    assert bound.chain_passes(own, block, 0.0) == 3 and bound.chain_passes(own, block, 1.0) == len(answer)
    assert bound.chain_passes([0.95, 0.95, 0.95, 0.5], 4, 0.86) == 3  # 0.9025 rides along, 0.857 does not
