"""Known speculative-sampling bugs, injected with pytest's monkeypatch (tests and benchmarks/audit_verdicts.py).

Each mirrors a bug the audit models exactly (``explorer.measure.audit.BUGS``).
"""

import torch

from explorer.decoding import acceptance, drafters, sampling, speculative
from explorer.families.eagle import head as eagle  # the module that calls warp_logits and sample


def no_residual(monkeypatch):
    """After a rejection, resample from p instead of norm(max(0, p - q))."""
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q: p)


def q_before_warping(monkeypatch):
    """The draft token is drawn from the warped q, but the q handed to verification is softmax(raw logits)."""
    warped = {}

    def raw_q(logits, temperature, top_k=None, top_p=None):
        warped["q"] = sampling.warp_logits(logits, temperature, top_k, top_p)
        return torch.softmax(logits.float(), -1)

    for module in (drafters, eagle):  # the model drafters and the EAGLE head
        monkeypatch.setattr(module, "warp_logits", raw_q)
        monkeypatch.setattr(module, "sample", lambda q, gen: sampling.sample(warped["q"], gen))


def bonus_from_draft(monkeypatch):
    """When every draft is accepted, the bonus token is drawn from the draft's last row instead of p."""
    verify = speculative.verify_drafts

    def broken(p, q, drafted, gen):
        if q is not None and drafted:
            p = p.clone()
            p[len(drafted)] = q[len(drafted) - 1]
        return verify(p, q, drafted, gen)

    monkeypatch.setattr(speculative, "verify_drafts", broken)


INJECT = {"no_residual": no_residual, "q_before_warping": q_before_warping, "bonus_from_draft": bonus_from_draft}
