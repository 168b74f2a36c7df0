"""What a drafter gives speculative decoding: the ``Draft`` (tokens and the distributions they came from) and the
``Drafter`` protocol. The decoding core's own drafters live in drafters.py; a model family's (EAGLE's head,
Gemma's assistant) in its folder under explorer/families, registered in registry.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from explorer.decoding.config import DecodeConfig


@dataclass
class Draft:
    """One proposal: g drafted tokens and, row by row, the distribution each was drawn from."""

    tokens: list[int]  # (g,), g <= gamma: fewer after an EOS, or none when there is nothing to propose
    q: torch.Tensor | None  # (g, V) float32, q[i] the warped distribution tokens[i] was drawn from; None when g = 0
    forward_s: float = 0.0  # synchronized wall time of the draft forward passes
    passes: int = 0  # draft forward passes made
    # A refining drafter may report its passes one by one: (tokens shown, their q, seconds) per pass.
    stages: list[tuple[tuple[int, ...], tuple[float, ...], float]] = field(default_factory=list)


@runtime_checkable
class Drafter(Protocol):
    """What speculative decoding needs from a drafter (as transformers' ``CandidateGenerator``).

    Exactness rests on one rule: ``Draft.q[i]`` is exactly the distribution ``Draft.tokens[i]``
    was drawn from, given the tokens before it, warped with ``cfg`` as the target's p is.
    """

    name: str  # shown in Proposal events

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, gen: torch.Generator) -> Draft:
        """``tokens``: the whole sequence so far (prompt + output, length T); draw up to ``gamma`` more with ``gen``."""
        ...

    def rollback(self, keep: int) -> None:
        """Only ``tokens[:keep]`` survived verification: drop any state (a KV cache) past position ``keep``."""
        ...

    # Optional: ``observe(drafted, accepted, kept)`` after each verification, with the tokens the step drafted (a
    # tree: the accepted path), how many of them the target accepted and the tokens kept (the accepted drafts and
    # the target's own), as transformers' candidate generators and vLLM's proposers hear back: a stateful drafter
    # (a suffix tree, an adaptive γ per context) learns from it. ``observe`` below calls it where it exists.

    @property
    def cache_len(self) -> int | None:
        """Positions in the drafter's KV cache (shown in Verification events); None without one."""
        ...


def observe(drafter: object, drafted: list[int], accepted: int, kept: list[int]) -> None:
    """Tell a drafter which of its tokens survived (its ``observe``, where it has one)."""
    hear = getattr(drafter, "observe", None)
    if hear is not None:
        hear(list(drafted), int(accepted), list(kept))
