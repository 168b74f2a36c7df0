"""The baseline: KV-cached autoregressive decoding, one target pass per token."""

from __future__ import annotations

import time
from collections.abc import Generator

import torch
from transformers import DynamicCache

from explorer.decoding.config import DecodeConfig
from explorer.decoding.events import DecodeResult, Event, TokenStep
from explorer.decoding.sampling import make_generator, sample, warp_logits
from explorer.runtime import Models, timed_forward


def decode_autoregressive(models: Models, prompt_ids: list[int],
                          cfg: DecodeConfig) -> Generator[Event, None, DecodeResult]:
    """Yield one TokenStep per new token (the first one's pass is the prefill); return the DecodeResult."""
    t0 = time.perf_counter()
    gen = make_generator(cfg.seed)
    eos = models.tokenizer.eos_token_id
    cache = DynamicCache()
    ids = torch.tensor([prompt_ids], device=models.device)  # (1, T)
    tokens: list[int] = []
    times: list[float] = []
    forward_s = 0.0
    for step in range(cfg.max_new_tokens):
        logits, dt = timed_forward(models.target, ids, cache, keep=1)
        forward_s += dt
        probs = warp_logits(logits[0, -1], cfg.temperature, cfg.top_k, cfg.top_p)  # (V,)
        token = sample(probs, gen)
        tokens.append(token)
        times.append(time.perf_counter() - t0)
        yield TokenStep(t=time.perf_counter(), step=step, token=token, p=float(probs[token]), forward_s=dt)
        if token == eos:
            break
        ids = torch.tensor([[token]], device=models.device)
    return DecodeResult(t0=t0, tokens=tokens, times=times, target_passes=len(tokens), target_forward_s=forward_s)
