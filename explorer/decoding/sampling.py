"""One place that turns logits into the distributions every decoder samples from.

Temperature, top-k and top-p are applied in that order (as ``transformers`` does), and the
result is used identically for the target (p) and the draft (q): exact speculative sampling
needs q to be *exactly* the distribution the draft token was drawn from.
Temperature 0 means greedy: the warped distribution is one-hot on the argmax.
"""

from __future__ import annotations

import torch


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int | None = None,
                top_p: float | None = None) -> torch.Tensor:
    """Logits (..., V) -> probabilities (..., V) in float32 after temperature, top-k, top-p."""
    logits = sanitize_logits(logits.float())
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = torch.nan_to_num(logits / temperature, posinf=torch.finfo(logits.dtype).max)  # tiny T can overflow
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        logits = _filter_top_p(logits, top_p)
    return torch.softmax(logits, dim=-1)


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p (at least one)."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before this token already enough
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sanitize_logits(logits: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf, +inf -> the largest finite value; a row with nothing finite becomes uniform."""
    logits = torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)
    dead = torch.isneginf(logits).all(-1, keepdim=True)
    return torch.where(dead, torch.zeros_like(logits), logits)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a 1-D probability vector with a seeded generator."""
    if probs.max() >= 1.0:  # one-hot (greedy): no random number is consumed
        return int(probs.argmax())
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, device="cpu"))  # the seeded generator is a CPU one


def make_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)
