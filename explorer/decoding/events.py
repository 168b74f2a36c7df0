"""Events the decoders yield, and the Trace they return.

Every event is a small frozen dataclass. ``t`` is a ``time.perf_counter()`` stamp taken
right after the event's work (the trace's ``t0`` is the stamp at the start of decoding),
``forward_s`` the synchronized wall time of the model forward pass(es) the event used.
Nothing here knows about Gradio, plotly or pandas.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenStep:
    """Autoregressive baseline: one target pass, one token."""

    t: float
    step: int
    token: int
    p: float  # probability of the token under the warped target distribution
    forward_s: float


@dataclass(frozen=True)
class Proposal:
    """The drafter proposes ``tokens``; ``q[i]`` is the probability each was drawn with.

    A token tree (``DecodeConfig.tree``) has one entry per node in ``tokens`` and ``q`` and its
    ``parents``: the index of each node's parent, -1 for the root (the last verified token); parents
    come before their children and siblings are listed in the order verification tries them. At
    T = 0 a tree's children are the draft's top-k and ``q`` is their draft softmax probability.
    """

    t: float
    step: int
    drafter: str
    gamma: int
    tokens: tuple[int, ...]
    q: tuple[float, ...]
    forward_s: float
    draft_passes: int
    parents: tuple[int, ...] | None = None  # a tree's parent index per node; None for a chain


@dataclass(frozen=True)
class DraftCheck:
    """The verdict on one drafted token (Leviathan et al. 2023, Alg. 1)."""

    position: int  # 0-based position within the proposal
    token: int
    p: float
    q: float
    accept_prob: float  # min(1, p/q)
    accepted: bool
    node: int | None = None  # a tree's node index (position is then its depth - 1); None for a chain


@dataclass(frozen=True)
class Verification:
    """One target pass over [last token, drafts...] and what it kept."""

    t: float
    step: int
    checks: tuple[DraftCheck, ...]  # up to and including the first rejection
    accepted: int
    # The step's one target-drawn token is exactly one of these two (the other is None):
    resampled: int | None  # drawn from norm(max(0, p - q)) after a rejection
    bonus: int | None  # drawn from the target's last distribution when every draft was accepted
    emitted: tuple[int, ...]  # tokens appended to the output by this step (after EOS / length cuts)
    forward_s: float
    target_cache_len: int  # target KV cache length after the rollback
    draft_cache_len: int | None
    next_gamma: int
    path: tuple[int, ...] | None = None  # a tree's accepted nodes, root to leaf; None for a chain


@dataclass(frozen=True)
class RefinementStep:
    """One denoiser pass of masked diffusion: which positions were revealed and with what (and which, if any, were
    masked again: ``remasked`` are applied before ``positions``)."""

    t: float
    step: int
    block: int
    positions: tuple[int, ...]  # output positions (0 = first new token)
    tokens: tuple[int, ...]
    confidences: tuple[float, ...]
    masks_left: int
    forward_s: float
    fed_tokens: int = 0  # positions this pass ran through the model (fewer with a KV cache)
    remasked: tuple[int, ...] = ()  # output positions masked again by this pass (sampler "revoke")
    remasked_tokens: tuple[int, ...] = ()  # the tokens they held
    remask_confidences: tuple[float, ...] = ()  # those tokens' probability under this pass
    why: str = ""  # the sampler's reason, in words
    # options no_adjacent_repeat / no_repeat_ngram: positions the rule chose but left masked (they would repeat what
    # a position revealed with them made), and revealed positions whose likeliest token a ban took out
    held: tuple[int, ...] = ()
    held_tokens: tuple[int, ...] = ()
    avoided: tuple[int, ...] = ()
    avoided_tokens: tuple[int, ...] = ()  # the repeat each would have been
    avoided_phrases: tuple[tuple[int, ...], ...] = ()  # no_repeat_ngram: the n-gram it would have repeated, or ()


Event = TokenStep | Proposal | Verification | RefinementStep


@dataclass
class DecodeResult:
    """What a decoder generator returns once it is exhausted; ``api.build_trace`` turns it into a Trace.

    The counters start at zero so a decoder can fill them in as it goes. ``times[i]`` is the
    offset from ``t0`` at which ``tokens[i]`` became final (and could be streamed).
    """

    t0: float  # time.perf_counter() at the start of decoding
    tokens: list[int] = field(default_factory=list)  # new tokens only, cut after an EOS
    times: list[float] = field(default_factory=list)  # one per token, seconds after t0
    target_passes: int = 0  # target (or denoiser) forward passes, the prefill included
    draft_passes: int = 0
    proposed: int = 0  # drafted tokens offered to verification
    accepted: int = 0
    target_forward_s: float = 0.0  # synchronized wall time inside the target's forward passes
    draft_forward_s: float = 0.0
    per_position: list[tuple[int, int]] = field(default_factory=list)  # speculative: (accepted, proposed) by position
    cache: str = "none"  # diffusion: the KV cache mode actually used
    fed_tokens: int | None = None  # diffusion: positions run through the denoiser over all passes


@dataclass
class Trace:
    """The result of one decode: the new tokens, the stats and every event in order."""

    method: str
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    stats: dict[str, Any]
    events: list[Event]
    config: dict[str, Any]
    t0: float
    token_times: list[float] = field(default_factory=list)  # seconds after t0 each token became final, in order

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; each event carries its type name under ``"event"``."""
        events = [{"event": type(e).__name__, **_plain(dataclasses.asdict(e))} for e in self.events]
        return {
            "method": self.method,
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "token_ids": self.token_ids,
            "text": self.text,
            "stats": self.stats,
            "config": self.config,
            "token_times": self.token_times,
            "events": events,
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
