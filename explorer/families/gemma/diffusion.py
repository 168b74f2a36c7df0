"""DiffusionGemma (``DiffusionGemmaForBlockDiffusion``): block diffusion over canvases with an encoder KV cache and
the entropy-bound sampler (``decode_diffusion_gemma``).

The rule is transformers' ``DiffusionGemmaGenerationMixin.generate``
(models/diffusion_gemma/generation_diffusion_gemma.py), restated so every step can be animated;
tests/test_gemma.py checks it against that reference on ``random-gemma4``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from explorer.decoding.config import DecodeConfig
from explorer.decoding.events import DecodeResult, Event, RefinementStep
from explorer.decoding.unmasking import entropy_bounded
from explorer.runtime import Models, synchronize

# Defaults of DiffusionGemmaGenerationConfig._get_default_generation_params (used when a checkpoint sets none).
DIFFUSION_DEFAULTS = {"max_denoising_steps": 48, "entropy_bound": 0.1, "t_min": 0.4, "t_max": 0.8,
                      "stability_threshold": 1, "confidence_threshold": 0.005}


def is_diffusion_gemma(model: nn.Module | None) -> bool:
    return type(model).__name__ == "DiffusionGemmaForBlockDiffusion"


# ----------------------------------------------------------------------------------------------
# DiffusionGemma: block diffusion with the entropy-bound sampler

@dataclass(frozen=True)
class DiffusionGemmaSettings:
    steps: int  # denoising steps per canvas (max_denoising_steps)
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int | None
    confidence_threshold: float | None


def diffusion_gemma_settings(model: nn.Module, cfg: DecodeConfig) -> DiffusionGemmaSettings:
    """Map the explorer's options onto DiffusionGemma's: steps per canvas = steps / canvases;
    ``entropy_bound`` is the sampler's bound (the checkpoint's own when unset); temperature 0 keeps the model's
    own schedule (t_max -> t_min), a temperature T > 0 runs the schedule T -> T/2."""
    gc = getattr(model, "generation_config", None)
    sampler = getattr(gc, "sampler_config", None)

    def default(name: str) -> Any:
        value = getattr(gc, name, None)
        return DIFFUSION_DEFAULTS[name] if value is None else value

    canvases = math.ceil(cfg.max_new_tokens / model.config.canvas_length)
    steps = max(1, cfg.diffusion_steps // canvases) if cfg.steps is not None else default("max_denoising_steps")
    bound = cfg.entropy_bound if cfg.entropy_bound is not None else (
        sampler.entropy_bound if sampler is not None else DIFFUSION_DEFAULTS["entropy_bound"])
    t_min, t_max = (default("t_min"), default("t_max")) if cfg.temperature == 0 else (
        cfg.temperature / 2, cfg.temperature)
    return DiffusionGemmaSettings(steps, float(bound), float(t_min), float(t_max), default("stability_threshold"),
                                  default("confidence_threshold"))


def accept_by_entropy(logits: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy-bound acceptance over the whole canvas (the diffusion lane's ``entropy`` sampler, one rule):
    returns (mask, entropies)."""
    entropy = torch.distributions.Categorical(logits=logits).entropy()  # (B, C)
    return entropy_bounded(entropy, bound), entropy


def decode_diffusion_gemma(models: Models, prompt_ids: list[int],
                           cfg: DecodeConfig) -> Generator[Event, None, DecodeResult]:
    """DiffusionGemma's generate, one RefinementStep per denoising step (batch 1).

    Per canvas: encode the uncached tokens into the KV cache; start from uniform random tokens; each
    step runs the decoder on the canvas (self-conditioned on the last step's logits), divides the logits
    by the linear temperature schedule, samples a canvas, keeps the entropy-bound accepted positions,
    renoises the rest with fresh random tokens, and stops early once the argmax canvas is stable and
    confident. The canvas shown (and kept) is the argmax canvas, what ``streamer.put_draft`` receives.
    Random draws come from a generator seeded with ``cfg.seed`` on the model's device, in transformers'
    order (canvas, then per step: sample, renoise), so a run equals ``generate`` after ``torch.manual_seed``.
    An event lists the positions whose argmax token changed, so replaying the events rebuilds every draft.
    """
    t0 = time.perf_counter()
    model = models.diffusion
    s = diffusion_gemma_settings(model, cfg)
    device = model.device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    canvas_len, vocab = model.config.canvas_length, model.config.text_config.vocab_size
    eos = models.diffusion_tokenizer.eos_token_id
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    ids = torch.tensor([prompt_ids], device=device)
    cur_len = ids.shape[1]
    mask = torch.ones((1, cur_len), dtype=torch.bool, device=device)
    enc_pos = torch.arange(0, cur_len, dtype=torch.int32, device=device)[None]
    out: list[int] = []
    revealed_t: list[float] = []
    passes, forward_s, step = 0, 0.0, 0
    for block in range(math.ceil(cfg.max_new_tokens / canvas_len)):
        unprocessed = ids if block == 0 else ids[:, -canvas_len:]
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            enc_mask = model.model.encoder.create_masks_for_generate(
                config=model.config, inputs_embeds=torch.empty((1, unprocessed.shape[1], 0), dtype=model.dtype,
                                                               device=device),
                attention_mask=mask, past_key_values=cache, position_ids=enc_pos)
            model.model.encoder(input_ids=unprocessed, attention_mask=enc_mask, past_key_values=cache,
                                position_ids=enc_pos)
        synchronize(device)
        forward_s += time.perf_counter() - start
        dec_pos = torch.arange(cur_len, cur_len + canvas_len, dtype=torch.int32, device=device)[None]
        canvas = torch.randint(0, vocab, (1, canvas_len), generator=gen, device=device)
        argmax = canvas
        dec_mask = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=cache,
            decoder_attention_mask=torch.nn.functional.pad(mask, (0, canvas_len), value=True))
        history = None if not s.stability_threshold else torch.full(
            (s.stability_threshold, 1, canvas_len), -1, dtype=torch.long, device=device)
        self_cond, shown = None, [None] * canvas_len
        for cur_step in reversed(range(1, s.steps + 1)):
            synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode():
                logits = model(decoder_input_ids=canvas, self_conditioning_logits=self_cond,
                               decoder_attention_mask=dec_mask, past_key_values=cache,
                               decoder_position_ids=dec_pos).logits
            synchronize(device)
            dt = time.perf_counter() - start
            cur = torch.tensor(cur_step, device=device, dtype=torch.int32)
            logits = logits / (s.t_min + (s.t_max - s.t_min) * (cur / s.steps))  # linear temperature schedule
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            sampled = torch.multinomial(probs.view(-1, vocab), 1, generator=gen).view(1, canvas_len)
            argmax = logits.argmax(-1)
            accepted, entropy = accept_by_entropy(logits, s.entropy_bound)
            noise = torch.randint(0, vocab, (1, canvas_len), generator=gen, device=device)
            canvas = torch.where(accepted, sampled, noise)  # accept, then renoise the rest
            done = bool(entropy.mean() < s.confidence_threshold) if s.confidence_threshold is not None else False
            if history is not None:
                done = done and bool((history == argmax[None]).all())
                history = torch.roll(history, shifts=-1, dims=0)
                history[-1] = argmax
            self_cond = logits.to(model.model.decoder.embed_tokens.weight.dtype)
            passes, forward_s, step = passes + 1, forward_s + dt, step + 1
            now = time.perf_counter()
            draft = argmax[0].tolist()
            changed = [i for i, tok in enumerate(draft) if shown[i] != tok]
            conf = probs[0].gather(-1, argmax[0][:, None])[:, 0]
            for i in changed:
                shown[i] = draft[i]
            yield RefinementStep(t=now, step=step - 1, block=block,
                                 positions=tuple(block * canvas_len + i for i in changed),
                                 tokens=tuple(draft[i] for i in changed),
                                 confidences=tuple(float(conf[i]) for i in changed),
                                 masks_left=int((~accepted).sum()), forward_s=dt)
            if done:
                break
        now = time.perf_counter() - t0
        new = argmax[0].tolist()
        out += new
        revealed_t += [now] * len(new)
        ids = torch.cat([ids, argmax], dim=-1)
        if eos is not None and eos in new:
            break
        mask = torch.nn.functional.pad(mask, (0, canvas_len), value=True)
        enc_pos, cur_len = dec_pos, cur_len + canvas_len
    out = out[:cfg.max_new_tokens]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return DecodeResult(t0=t0, tokens=out, times=revealed_t[:len(out)], target_passes=passes,
                        target_forward_s=forward_s)
