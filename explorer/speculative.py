"""Speculative decoding: draft gamma tokens, verify them in one target pass.

The rule is Leviathan et al. 2023 (Alg. 1) / Chen et al. 2023: accept draft x with
probability min(1, p(x)/q(x)); on the first rejection draw from norm(max(0, p - q)); if all
are accepted draw a bonus token from the target's last distribution. p and q are the warped
distributions (``sampling.warp_logits``), so the output is distributed exactly as the target's.
At temperature 0 both are one-hot and the rule reduces to "keep the longest prefix equal to
the target's argmax".
"""

from __future__ import annotations

import time
from collections.abc import Generator

import torch
from transformers import DynamicCache

from explorer.config import DecodeConfig
from explorer.drafters import crop_cache, make_drafter
from explorer.events import DraftCheck, Event, Proposal, Verification
from explorer.models import Models, timed_forward
from explorer.sampling import make_generator, sample, uniform, warp_logits

MAX_ADAPTIVE_GAMMA = 16


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
    """p: (g+1, V) target distributions, q: (g, V) draft distributions.

    Returns (accepted count, checks, next token, whether the next token is a bonus).
    """
    checks = []
    for i, token in enumerate(drafted):
        p_x, q_x = float(p[i, token]), float(q[i, token])
        ratio = acceptance_probability(p_x, q_x)
        accepted = ratio >= 1.0 or (ratio > 0.0 and uniform(gen) < ratio)
        checks.append(DraftCheck(i, token, p_x, q_x, ratio, accepted))
        if not accepted:
            return i, checks, sample(residual_distribution(p[i], q[i]), gen), False
    return len(drafted), checks, sample(p[len(drafted)], gen), True


def next_gamma(gamma: int, all_accepted: bool, cfg: DecodeConfig) -> int:
    """Adaptive gamma (as transformers' heuristic): +2 after a full acceptance, -1 after a rejection."""
    if not cfg.adaptive_gamma:
        return gamma
    return min(MAX_ADAPTIVE_GAMMA, gamma + 2) if all_accepted else max(1, gamma - 1)


def decode_speculative(models: Models, prompt_ids: list[int], cfg: DecodeConfig) -> Generator[Event, None, dict]:
    """Yield a Proposal and a Verification per step; return the raw result (tokens, times, counters).

    Invariant: after each step the target cache holds every token but the last; a step feeds
    [last, d1..dg] (the first step feeds the whole prompt too, so the prefill is its verify
    pass) and is cropped back to the accepted length afterwards.
    """
    t0 = time.perf_counter()
    gen = make_generator(cfg.seed)
    eos = models.tokenizer.eos_token_id
    drafter = make_drafter(models, cfg)
    device = models.device
    cache = DynamicCache()
    tokens = list(prompt_ids)
    new: list[int] = []
    times: list[float] = []
    counters = {"target_passes": 0, "draft_passes": 0, "proposed": 0, "accepted": 0,
                "target_forward_s": 0.0, "draft_forward_s": 0.0}
    per_position = [[0, 0] for _ in range(max(cfg.gamma, MAX_ADAPTIVE_GAMMA))]  # [accepted, proposed] by draft position
    gamma, step = cfg.gamma, 0
    while len(new) < cfg.max_new_tokens:
        remaining = cfg.max_new_tokens - len(new)
        draft = drafter.propose(tokens, min(gamma, remaining - 1), cfg, gen) if remaining > 1 else None
        drafted = draft.tokens if draft is not None else []
        if draft is not None:
            counters["draft_passes"] += draft.passes
            counters["draft_forward_s"] += draft.forward_s
            q_drafted = tuple(float(draft.q[i, x]) for i, x in enumerate(drafted))
            for shown, q_shown, dt in draft.stages[:-1]:  # a refining draft: one Proposal per pass
                yield Proposal(time.perf_counter(), step, drafter.name, gamma, shown, q_shown, dt, 1)
            last = draft.stages[-1][2] if draft.stages else draft.forward_s
            yield Proposal(time.perf_counter(), step, drafter.name, gamma, tuple(drafted), q_drafted, last,
                           1 if draft.stages else draft.passes)
        feed = tokens[cache.get_seq_length():] + drafted  # the whole prompt on the first step, then [last, drafts]
        logits, dt = timed_forward(models.target, torch.tensor([feed], device=device), cache, keep=len(drafted) + 1)
        p = warp_logits(logits[0], cfg.temperature, cfg.top_k, cfg.top_p)  # (g+1, V)
        accepted, checks, extra, is_bonus = verify_drafts(p, draft.q if drafted else None, drafted, gen)
        emitted = _cut(drafted[:accepted] + [extra], eos, remaining)
        keep = len(tokens) + accepted  # tokens before this step + accepted drafts
        crop_cache(cache, keep)
        drafter.rollback(keep)
        tokens += emitted
        new += emitted
        times += [time.perf_counter() - t0] * len(emitted)
        counters["target_passes"] += 1
        counters["target_forward_s"] += dt
        counters["proposed"] += len(drafted)
        counters["accepted"] += accepted
        for check in checks:
            per_position[check.position][0] += check.accepted
            per_position[check.position][1] += 1
        gamma = next_gamma(gamma, bool(drafted) and accepted == len(drafted), cfg)
        yield Verification(time.perf_counter(), step, tuple(checks), accepted, None if is_bonus else extra,
                           extra if is_bonus else None, tuple(emitted), dt, cache.get_seq_length(),
                           drafter.cache_len, gamma)
        step += 1
        if eos in emitted:
            break
    counters["per_position"] = [[a, n] for a, n in per_position if n]
    return {"t0": t0, "tokens": new, "times": times, **counters}


def _cut(emitted: list[int], eos: int | None, remaining: int) -> list[int]:
    """Nothing after an EOS, nothing past max_new_tokens."""
    if eos is not None and eos in emitted:
        emitted = emitted[: emitted.index(eos) + 1]
    return emitted[:remaining]
