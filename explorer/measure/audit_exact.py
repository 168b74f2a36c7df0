"""The exact distributions the audit tests against: the target's warped first-token (and first-two-token)
distribution from a numpy reference warp, the drafts' q, and the distributions each known sampler bug would
produce instead."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from explorer.decoding.api import encode_prompt
from explorer.decoding.drafters import make_drafter
from explorer.decoding.sampling import make_generator
from explorer.runtime import Models

# ------------------------------------------------------------------------------ exact distributions

def reference_warp(logits: np.ndarray, temperature: float, top_k: int | None = None,
                   top_p: float | None = None) -> np.ndarray:
    """softmax(logits / T) restricted to the top k, then to the smallest top-p set; T = 0: argmax one-hot."""
    z = np.nan_to_num(np.asarray(logits, dtype=np.float64), nan=-np.inf)
    if temperature == 0:
        return np.eye(len(z))[int(np.argmax(z))]
    z = z / temperature
    if top_k is not None and top_k < len(z):
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p is not None and top_p < 1:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of the tokens ranked above
        keep = np.zeros(len(z), bool)
        keep[order[before < top_p]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs

ENUMERATE_MAX = 64  # enumerate the first token's outcomes (p or q support) up to this many


@dataclass
class Exact:
    p1: np.ndarray  # (V,) target, first new token
    q1: np.ndarray  # (V,) warped draft, first draft position (zeros when the drafter proposed nothing)
    q1_raw: np.ndarray  # (V,) draft before warping
    first: np.ndarray | None  # (S,) token ids enumerated at position 1
    p2: np.ndarray | None  # (S, V) target at position 2 after each enumerated first token
    eos: int | None = None  # a first token equal to EOS ends the output: its row is one-hot on EOS
    # A drafter that reads the target's hidden states drafts nothing before the prefill (the first
    # token comes from p); it drafts position 2 from the prefill's features and the first token:
    q2: np.ndarray | None = None  # (S, V) its warped distribution at position 2 after each first token
    q2_raw: np.ndarray | None = None  # (S, V) the same before warping

    @property
    def drafts_second(self) -> bool:
        return self.q2 is not None


def exact_distributions(models: Models, prompt: str, cfg) -> Exact:
    ids, _ = encode_prompt(models.tokenizer, prompt, models.preset.chat)

    def target_rows(seqs: list[list[int]]) -> np.ndarray:
        rows = []
        with torch.inference_mode():  # one sequence a pass, the decoders' batch (an exact precision takes no other)
            for seq in seqs:
                rows.append(models.target(input_ids=torch.tensor([seq], device=models.device)).logits[0, -1])
        return np.stack([reference_warp(row, cfg.temperature, cfg.top_k, cfg.top_p)
                         for row in torch.stack(rows).double().cpu().numpy()])

    p1 = target_rows([ids])[0]
    q1, q1_raw = np.zeros_like(p1), np.zeros_like(p1)
    drafter = make_drafter(models, cfg)
    after_prefill = getattr(drafter, "drafts_after_prefill", False)  # it drafts from the prefill's features
    raw_cfg = replace(cfg, temperature=1.0, top_k=None, top_p=None)
    for c, out in ((cfg, q1), (raw_cfg, q1_raw)) if not after_prefill else ():
        # through the protocol: the first draft's q is the distribution the drafter drew it from (one-hot for
        # prompt lookup), warped as ``c`` says
        draft = make_drafter(models, c).propose(list(ids), 1, c, make_generator(0))
        if draft.tokens:
            out[:] = draft.q[0].double().cpu().numpy()[:len(out)]
    support = np.flatnonzero((p1 > 0) | (q1 > 0))
    if len(support) > ENUMERATE_MAX:
        return Exact(p1, q1, q1_raw, None, None)
    p2 = np.concatenate([target_rows([ids + [int(x)] for x in support[i:i + 16]])
                         for i in range(0, len(support), 16)])
    eos = models.tokenizer.eos_token_id
    for i, x in enumerate(support):
        if x == eos:
            p2[i] = np.eye(len(p1))[eos]
    exact = Exact(p1, q1, q1_raw, support, p2, eos)
    if after_prefill:
        exact.q2, exact.q2_raw = second_step_drafts(models, ids, support, cfg, eos)
    return exact


def second_step_drafts(models: Models, ids: list[int], first: np.ndarray, cfg,
                       eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(S, V) warped and unwarped q at position 2 of a drafter that drafts after the prefill: for each first
    token, a fresh drafter sees the prefill's hidden states (its own capture) and drafts one token."""
    raw_cfg = replace(cfg, temperature=1.0, top_k=None, top_p=None)
    out = {}
    for name, c in (("warped", cfg), ("raw", raw_cfg)):
        rows = []
        for x in first:
            drafter = make_drafter(models, c)
            drafter.propose(list(ids), 1, c, make_generator(0))  # nothing to draft yet: arms the capture
            with torch.inference_mode():
                models.target(input_ids=torch.tensor([ids], device=models.device))  # the prefill
            draft = drafter.propose(list(ids) + [int(x)], 1, c, make_generator(0))
            empty = int(x) == eos or not draft.tokens  # an EOS ends the output: nothing is drafted after it
            rows.append(np.zeros(len(draft.q[0]) if draft.tokens else models.target.config.vocab_size)
                        if empty else draft.q[0].double().cpu().numpy())
        out[name] = np.stack(rows)
    return out["warped"], out["raw"]


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r = np.clip(p - q, 0, None)
    return r / r.sum() if r.sum() > 0 else p


def _accept(p: np.ndarray, q_verify: np.ndarray) -> np.ndarray:
    """min(1, p/q) per token; q = 0 accepts what p allows."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q_verify > 0, np.minimum(1.0, p / q_verify), (p > 0).astype(float))


def verified_step(p: np.ndarray, q: np.ndarray, q_raw: np.ndarray, bug: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(distribution of the token a step emits at a drafted position, probability of 'drafted x and it
    was accepted' per x), under the rule or one of the known bugs."""
    if not q.any():  # nothing drafted: the token is drawn from p
        return p, np.zeros_like(p)
    q_verify = q_raw if bug == "q_before_warping" else q
    accepted = q * _accept(p, q_verify)
    residual = p if bug == "no_residual" else _residual(p, q_verify)
    return accepted + (1 - accepted.sum()) * residual, accepted


def first_step(e: Exact, bug: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(distribution of the first emitted token, probability of 'drafted x and it was accepted' per x)."""
    return verified_step(e.p1, e.q1, e.q1_raw, bug)


def joint_two(e: Exact, bug: str | None) -> np.ndarray:
    """(S, V) distribution of the first two tokens when the first step drafts exactly one token, or (a
    drafter that drafts after the prefill) when the second step does."""
    if e.drafts_second:
        rows = [verified_step(e.p2[i], e.q2[i], e.q2_raw[i], bug)[0] for i in range(len(e.first))]
        return e.p1[e.first][:, None] * np.stack(rows)
    first, accepted = first_step(e, bug)
    f, a = first[e.first], accepted[e.first]
    if bug == "bonus_from_draft":
        joint = a[:, None] * e.q1[None, :] + (f - a)[:, None] * e.p2
        ends = e.first == e.eos  # an accepted EOS ends the output: no bonus
        joint[ends] = f[ends, None] * e.p2[ends]
        return joint
    return f[:, None] * e.p2
