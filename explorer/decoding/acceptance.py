"""The acceptance rule of speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023), shared by chains
(speculative.py) and trees (tree.py): accept draft x with probability min(1, p(x)/q(x)); on the first rejection
draw from norm(max(0, p - q)); after a full acceptance draw a bonus token from p."""

from __future__ import annotations

import torch

from explorer.decoding.events import DraftCheck
from explorer.decoding.sampling import sample, uniform


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p/q), guarding q = 0 (a token the draft could not have drawn)."""
    if q_x <= 0:
        return 1.0 if p_x > 0 else 0.0
    return min(1.0, p_x / q_x)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); when it is all zero (p == q numerically) fall back to p."""
    residual = torch.clamp(p - q, min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def verify_drafts(p: torch.Tensor, q: torch.Tensor | None, drafted: list[int],
                  gen: torch.Generator) -> tuple[int, list[DraftCheck], int, bool]:
    """p: (g+1, V) target distributions, q: (g, V) draft distributions (None when g = 0).

    Returns (accepted count, checks, the target-drawn token, whether that token is a bonus).
    """
    checks = []
    for i, token in enumerate(drafted):
        # Accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)) ...
        p_x, q_x = float(p[i, token]), float(q[i, token])
        ratio = acceptance_probability(p_x, q_x)
        accepted = ratio >= 1.0 or (ratio > 0.0 and uniform(gen) < ratio)
        checks.append(DraftCheck(position=i, token=token, p=p_x, q=q_x, accept_prob=ratio, accepted=accepted))
        if not accepted:  # ... on the first rejection draw the replacement from norm(max(0, p_i - q_i)) ...
            return i, checks, sample(residual_distribution(p[i], q[i]), gen), False
    # ... and when all g were accepted draw a bonus token from p_g, the target's next distribution.
    return len(drafted), checks, sample(p[len(drafted)], gen), True


def cut_emitted(emitted: list[int], eos: int | None, remaining: int) -> list[int]:
    """Nothing after an EOS, nothing past max_new_tokens."""
    if eos is not None and eos in emitted:
        emitted = emitted[: emitted.index(eos) + 1]
    return emitted[:remaining]
