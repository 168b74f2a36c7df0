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
from collections.abc import Generator, Iterator

import torch
from transformers import DynamicCache

from explorer.decoding.acceptance import (  # noqa: F401  (verify_drafts and the rule: imported from here too)
    acceptance_probability,
    cut_emitted,
    residual_distribution,
    verify_drafts,
)
from explorer.decoding.config import DecodeConfig, parse_tree
from explorer.decoding.draft import Draft, observe
from explorer.decoding.drafters import crop_cache, make_drafter
from explorer.decoding.events import DecodeResult, Event, Proposal, Verification
from explorer.decoding.sampling import make_generator, warp_logits
from explorer.decoding.speculative_tree import decode_speculative_tree
from explorer.runtime import Models, timed_forward

MAX_ADAPTIVE_GAMMA = 16


def next_gamma(gamma: int, all_accepted: bool, cfg: DecodeConfig) -> int:
    """Adaptive gamma (as transformers' heuristic): +2 after a full acceptance, -1 after a rejection."""
    if not cfg.adaptive_gamma:
        return gamma
    return min(MAX_ADAPTIVE_GAMMA, gamma + 2) if all_accepted else max(1, gamma - 1)


def decode_speculative(models: Models, prompt_ids: list[int],
                       cfg: DecodeConfig) -> Generator[Event, None, DecodeResult]:
    """Yield a Proposal and a Verification per step; return the DecodeResult (tokens, times, counters).

    Invariant: after each step the target cache holds every token but the last; a step feeds
    [last, d1..dg] (the first step feeds the whole prompt too, so the prefill is its verify
    pass) and is cropped back to the accepted length afterwards. With ``cfg.tree`` the step drafts and
    verifies a token tree instead (``speculative_tree``).
    """
    if parse_tree(cfg.tree) is not None:

        return (yield from decode_speculative_tree(models, prompt_ids, cfg))
    result = DecodeResult(t0=time.perf_counter())
    gen = make_generator(cfg.seed)
    eos = models.tokenizer.eos_token_id
    drafter = make_drafter(models, cfg)
    device = models.device
    cache = DynamicCache()
    tokens = list(prompt_ids)
    per_position = [[0, 0] for _ in range(max(cfg.gamma, MAX_ADAPTIVE_GAMMA))]  # [accepted, proposed] by draft position
    gamma, step = cfg.gamma, 0
    while len(result.tokens) < cfg.max_new_tokens:
        # 1. draft: up to gamma tokens (never more than fit), each with the distribution q it was drawn from
        remaining = cfg.max_new_tokens - len(result.tokens)
        asked = min(gamma, remaining - 1)  # the drafts this step asks for (a Proposal's gamma)
        draft = drafter.propose(tokens, asked, cfg, gen) if remaining > 1 else None
        drafted = draft.tokens if draft is not None else []
        if draft is not None:
            yield from _proposals(draft, step, drafter.name, asked)
            result.draft_passes += draft.passes
            result.draft_forward_s += draft.forward_s
        # 2. verify: one target pass over the tokens it has not seen, the drafts included
        feed = tokens[cache.get_seq_length():] + drafted  # the whole prompt on the first step, then [last, drafts]
        logits, dt = timed_forward(models.target, torch.tensor([feed], device=device), cache, keep=len(drafted) + 1)
        p = warp_logits(logits[0], cfg.temperature, cfg.top_k, cfg.top_p)  # (g+1, V)
        accepted, checks, drawn, is_bonus = verify_drafts(p, draft.q if drafted else None, drafted, gen)
        # 3. keep the accepted drafts and the target-drawn token; roll both caches back to what was kept
        emitted = cut_emitted(drafted[:accepted] + [drawn], eos, remaining)
        keep = len(tokens) + accepted  # tokens before this step + accepted drafts
        crop_cache(cache, keep)
        drafter.rollback(keep)
        observe(drafter, drafted, accepted, emitted)
        tokens += emitted
        result.tokens += emitted
        result.times += [time.perf_counter() - result.t0] * len(emitted)
        result.target_passes += 1
        result.target_forward_s += dt
        result.proposed += len(drafted)
        result.accepted += accepted
        for check in checks:
            per_position[check.position][0] += check.accepted
            per_position[check.position][1] += 1
        gamma = next_gamma(gamma, bool(drafted) and accepted == len(drafted), cfg)
        yield Verification(t=time.perf_counter(), step=step, checks=tuple(checks), accepted=accepted,
                           resampled=None if is_bonus else drawn, bonus=drawn if is_bonus else None,
                           emitted=tuple(emitted), forward_s=dt, target_cache_len=cache.get_seq_length(),
                           draft_cache_len=drafter.cache_len, next_gamma=gamma)
        step += 1
        if eos in emitted:
            break
    result.per_position = [(a, n) for a, n in per_position if n]
    return result


def _proposals(draft: Draft, step: int, drafter: str, gamma: int) -> Iterator[Proposal]:
    """One Proposal per draft, or one per pass of a refining drafter (its ``stages``), the last the final draft."""
    for shown, q_shown, dt in draft.stages[:-1]:
        yield Proposal(t=time.perf_counter(), step=step, drafter=drafter, gamma=gamma, tokens=shown, q=q_shown,
                       forward_s=dt, draft_passes=1)
    q_drafted = tuple(float(draft.q[i, x]) for i, x in enumerate(draft.tokens))
    yield Proposal(t=time.perf_counter(), step=step, drafter=drafter, gamma=gamma, tokens=tuple(draft.tokens),
                   q=q_drafted, forward_s=draft.stages[-1][2] if draft.stages else draft.forward_s,
                   draft_passes=1 if draft.stages else draft.passes)
