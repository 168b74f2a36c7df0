"""Cross-checks between a live engine and the explorer, and the explorer's prediction of the batch effect.

1. Greedy equality: the engine's greedy tokens for a prompt equal the explorer's own greedy decode of the same
   model, token for token (the prompt is sent as the explorer's token ids, so tokenization cannot differ).
2. Acceptance agreement: at concurrency 1, the accepted drafts /metrics counted over a request equal the ones
   inferred from its stream (sum of tokens-per-chunk - 1), and its drafting steps equal the chunks after the
   first.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

import explorer
from explorer.engine.client import run_one
from explorer.engine.counters import scrape
from explorer.measure.costs import batch_costs


@dataclass
class GreedyCheck:
    prompt: str
    prompt_ids: list[int]
    explorer_ids: list[int]
    engine_ids: list[int]

    @property
    def equal(self) -> bool:
        return self.explorer_ids == self.engine_ids

    @property
    def first_difference(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.explorer_ids, self.engine_ids, strict=False)):
            if a != b:
                return i
        return None if len(self.explorer_ids) == len(self.engine_ids) else min(len(self.explorer_ids),
                                                                             len(self.engine_ids))


def greedy_check(url: str, models, prompt: str, max_tokens: int = 32, model: str | None = None) -> GreedyCheck:
    """The explorer's autoregressive greedy decode vs the engine's, on the same prompt ids."""
    trace = explorer.decode("autoregressive", models, prompt, max_new_tokens=max_tokens, temperature=0.0)
    record = run_one(url, list(trace.prompt_ids), max_tokens=len(trace.token_ids) or 1, temperature=0.0,
                     model=model, want_ids=True, ignore_eos=True)
    if record.error:
        raise RuntimeError(f"engine request failed: {record.error}")
    return GreedyCheck(prompt, list(trace.prompt_ids), list(trace.token_ids), list(record.token_ids or []))


@dataclass
class AcceptanceCheck:
    accepted_metrics: float
    accepted_inferred: int
    drafts_metrics: float
    steps_inferred: int
    tokens: int
    same_steps: bool  # the measured request's bursts repeat the first run's (greedy is deterministic)

    @property
    def agree(self) -> bool:
        return self.same_steps and self.accepted_metrics == self.accepted_inferred


def acceptance_check(url: str, prompt: str | list[int], max_tokens: int = 64, chat: bool = False,
                     model: str | None = None) -> AcceptanceCheck | None:
    """Accepted drafts by /metrics vs by the stream, one greedy request alone on the server.

    vLLM schedules whole drafts even in a request's last step and drops what lies past ``max_tokens``, yet
    counts it as accepted. So a first run finds where the steps end, and the measured run stops exactly at the
    end of its second-to-last step: none of its accepted drafts is dropped, and the counts must be equal.
    None when the server exports no speculative counters.
    """
    first = run_one(url, prompt, max_tokens=max_tokens, temperature=0.0, chat=chat, model=model, ignore_eos=True)
    if first.error:
        raise RuntimeError(f"engine request failed: {first.error}")
    sizes = [c.tokens for c in first.chunks if c.tokens > 0]
    cut = sum(sizes[:-1]) if len(sizes) > 1 else sum(sizes)
    before = scrape(url)
    record = run_one(url, prompt, max_tokens=cut, temperature=0.0, chat=chat, model=model, ignore_eos=True)
    after = scrape(url)
    if record.error:
        raise RuntimeError(f"engine request failed: {record.error}")
    if before is None or after is None or after.spec is None:
        return None
    spec = after.spec.minus(before.spec)
    same = [c.tokens for c in record.chunks if c.tokens > 0] == sizes[:len(record.bursts) + 1]
    return AcceptanceCheck(spec.accepted, record.inferred_accepted, spec.drafts, len(record.bursts), record.tokens,
                           same)


def predicted_gain(preset: str, spec: str, gamma: int, alpha: float, concurrencies: list[int]) -> pd.DataFrame:
    """Speculation's throughput gain at batch B predicted from the explorer's timed forward passes of the same
    preset: E[tokens per step] / (gamma * c_B + v_B), with c_B the draft/target cost ratio at batch B (0 for
    n-gram drafting) and v_B the cost of a (gamma+1)-token verify pass relative to a 1-token pass; ``noisy`` flags a
    batch whose timed passes spread too widely (``metrics.noise_flag``)."""
    models = explorer.load_models(preset)
    frame = batch_costs(models, gamma, alpha, tuple(concurrencies), reps=5, progress=False)
    expected = (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1
    c = frame["cost_ratio_c"] if spec == "draft" else 0.0
    frame["predicted_gain"] = expected / (gamma * c + frame["verify_ratio"])
    frame["concurrency"] = frame["batch"]
    frame["spec"] = spec
    return frame[["concurrency", "spec", "gamma", "alpha", "cost_ratio_c", "verify_ratio", "predicted_gain",
                  "noisy"]]
