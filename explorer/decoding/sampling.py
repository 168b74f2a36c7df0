"""One place that turns logits into the distributions every decoder samples from.

Temperature, top-k and top-p are applied in that order (as ``transformers`` does), and the
result is used identically for the target (p) and the draft (q): exact speculative sampling
needs q to be *exactly* the distribution the draft token was drawn from.
Temperature 0 means greedy: the warped distribution is one-hot on the argmax.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int | None = None,
                top_p: float | None = None) -> torch.Tensor:
    """Logits (..., V) -> probabilities (..., V) in float32 after temperature, top-k, top-p."""
    if temperature == 0:
        top = greedy_argmax(logits)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top[..., None], 1.0)
    logits = sanitize_logits(logits.float())
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


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``sanitize_logits(logits).argmax(-1)`` without sanitizing the whole vocabulary when it changes nothing:
    torch's argmax returns a NaN's index when a row has one, so a row whose argmax is finite or +inf holds no NaN,
    and sanitizing keeps its first maximum (+inf becomes the largest finite value, ties keep the first index)."""
    top = fast_argmax(logits)
    chosen = logits.gather(-1, top.unsqueeze(-1))
    if bool((torch.isnan(chosen) | torch.isneginf(chosen)).any()):  # a NaN or a dead row: the full rule
        return sanitize_logits(logits.float()).argmax(-1)
    return top


def fast_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)``: numpy's on a CPU float32/float64 tensor (the first maximum; a NaN counts as the maximum, as
    in torch), which scans a 49,152-token row in a few microseconds where torch's one-thread argmax takes about 60."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() >= 1:
        return torch.from_numpy(np.asarray(x.detach().numpy().argmax(-1)))
    return x.argmax(-1)


def sanitize_logits(logits: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf, +inf -> the largest finite value; a row with nothing finite becomes uniform."""
    if logits.numel() and bool(torch.isfinite(logits.amax(-1)).all()):  # (NaN wins amax) nothing to mend: one read
        return logits
    logits = torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)
    dead = torch.isneginf(logits).all(-1, keepdim=True)
    return torch.where(dead, torch.zeros_like(logits), logits)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a 1-D probability vector with a seeded generator."""
    top = int(fast_argmax(probs))
    if probs[top] >= 1.0:  # one-hot (greedy): no random number is consumed
        return top
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, device="cpu"))  # the seeded generator is a CPU one


def make_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def token_probability(logits: torch.Tensor, token: int) -> float:
    """The untempered softmax probability of ``token`` under ``logits`` (V,): what ``draft_confidence`` multiplies."""
    logits = logits.float()
    return math.exp(float(logits[token] - torch.logsumexp(logits, -1)))
