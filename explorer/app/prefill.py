"""What reading a long prompt costs on this machine, before the run: every lane's prefill passes, timed from one
measured pass, the limit a prompt must stay under, and the words a waiting lane shows while it reads."""

from __future__ import annotations

import time
from typing import Any

import torch

from explorer.runtime import Models, synchronize

PREFILL_LIMIT_S = 30.0  # a prompt whose prefill alone would take longer is refused, with the length that fits
MEASURE_TOKENS = 256  # the pass timed once per loaded bundle
_PER_TOKEN: dict[int, float] = {}  # id(target) -> measured seconds per prompt token in one prefill pass


def seconds_per_token(models: Models) -> float:
    """One prefill pass over MEASURE_TOKENS tokens through the target, at the precision it runs, timed once per
    bundle (about a second on a 2-core CPU at int8): seconds per prompt token."""
    key = id(models.target)
    if key not in _PER_TOKEN:
        vocab = int(models.target.get_output_embeddings().weight.shape[0])
        n = max(1, min(MEASURE_TOKENS, int(models.context_length) - 1))
        ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0))  # cpu: the seeded draw
        with torch.inference_mode():
            synchronize(models.device)
            start = time.perf_counter()
            models.target(input_ids=ids.to(models.device), logits_to_keep=1)
            synchronize(models.device)
            _PER_TOKEN[key] = (time.perf_counter() - start) / n
    return _PER_TOKEN[key]


def passes_over_prompt(method: str, options: dict[str, Any]) -> float:
    """How many passes over the whole prompt a lane makes: one prefill (speculative: plus its drafter's, counted
    as a fraction of a target pass), and for diffusion one full pass a block (every pass without a KV cache)."""
    if method == "diffusion":
        n = int(options.get("max_new_tokens", 64))
        blocks = n // int(options.get("block_length") or n)
        return float(options.get("steps") or n) if options.get("cache") == "none" else float(blocks)
    return 1.25 if method == "speculative" else 1.0


def estimate(models: Models, prompt_tokens: int, options: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Seconds each lane spends reading the prompt when it runs alone (the lanes share the CPU when live)."""
    per = seconds_per_token(models)
    return {m: per * prompt_tokens * passes_over_prompt(m, o) for m, o in options.items()}


def limit_tokens(models: Models) -> int:
    """The longest prompt one prefill reads within PREFILL_LIMIT_S here."""
    return int(PREFILL_LIMIT_S / seconds_per_token(models))


def reading_note(prompt_tokens: int, estimate_s: float, elapsed_s: float) -> str:
    """A waiting lane's line while it reads the prompt: what, how long it should take, how long so far."""
    return (f"reading the prompt: {prompt_tokens:,} tokens, about {estimate_s:.0f} s alone on this machine "
            f"(measured); {elapsed_s:.0f} s so far")
