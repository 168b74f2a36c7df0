"""Masked-diffusion decoding: N masked positions refined over K joint denoiser passes.

The sampler of LLaDA (Nie et al. 2025, Alg. 4-5 / Appendix B): the output is split into
semi-autoregressive blocks; within a block each step predicts every masked position, keeps
the ``schedule[s]`` most confident predictions ("low_confidence" remasking: the rest stay
masked) or random ones ("random"). Sampling at temperature T is Gumbel-max on logits/T in
float64 (categorical noise in low precision biases the sample). With ``threshold``
(Fast-dLLM, Wu et al. 2025, Sec. 3.2) a step reveals every masked position of the block whose
confidence exceeds the threshold, at least one. Models that predict the next position (Dream,
AR-adapted denoisers) have their logits shifted right by one. Which positions a pass commits is the
``sampler``'s rule (unmasking.py); ``no_adjacent_repeat`` takes out, before any rule ranks, the word a
filled neighbour holds (in any case or spacing: "plants" then " Plants", "pythonpython"; a digit glued to a digit is
no repeat) or the nearest word holds across 1-3 filled punctuation tokens ("plants, plants", "8, 8"), punctuation
between two equal words ("moment [mask] moment"), and keeps the tokens one pass reveals from making such a repeat
together ("python\npython"); ``no_repeat_ngram``
takes out every token that would complete an n-gram the answer already holds, and keeps the tokens revealed together
from making one.

KV cache (Fast-dLLM, Sec. 3.1), option ``cache``: ``none`` runs every pass over prompt + all N
positions. ``prefix`` runs one full pass at the start of each block, keeps the keys and values of
everything before the block (prompt and finished blocks) and feeds only the block and what follows
it for the block's other steps. ``dual`` also keeps the masked suffix after the block, so those
steps feed the block alone. Both are approximations: the cached keys were computed against the
canvas at the start of the block and are not updated as the block fills in.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Generator

import torch
from torch import nn
from transformers import DynamicCache

from explorer.decoding.config import DEFAULT_CACHE, DecodeConfig
from explorer.decoding.events import DecodeResult, Event, RefinementStep
from explorer.decoding.registry import diffusion_sampler
from explorer.decoding.sampling import fast_argmax, make_generator, sanitize_logits, warp_logits
from explorer.decoding.unmasking import (
    READS_PROBS,
    Pass,
    Words,
    across_punctuation,
    ban_repeats,
    ban_words,
    bridges_repeat,
    ngram_bans,
    plan_pass,
    repeated_ngram,
)
from explorer.errors import ExplorerError
from explorer.runtime import Models, timed_forward


def reveal_schedule(masked: int, steps: int) -> list[int]:
    """How many tokens each step reveals: a linear schedule, the remainder to the first steps."""
    base, extra = divmod(masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def predict_tokens(logits: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator, banned: list[int],
                   live: torch.Tensor | None = None, probs: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """logits (B, V) -> predicted tokens (B,), their confidences (B,) and the distributions (B, V), in float64.
    ``live`` (B,) bool: the rows a sampler reads (the others: token 0, confidence 0, an all-zero row); the random
    draws are those of all B rows, so a seed gives the same tokens whichever rows are live. ``probs`` False: no
    distributions (None), for a sampler that ranks by the confidences alone; greedy, such a pass takes the likeliest
    token and its probability from the float32 logits, as LLaDA's and Fast-dLLM's samplers do (a float64 copy and exp
    of the rows cost three times as much; the tokens are the same, a confidence differs in its last float32 bits)."""
    rows = None if live is None or bool(live.all()) else live.nonzero()[:, 0]
    full = logits
    if rows is not None:
        logits = logits[rows]  # a copy
    warped = bool(cfg.top_k or (cfg.top_p is not None and cfg.top_p < 1))
    lean = cfg.temperature == 0 and not warped and not probs and cfg.remasking != "random"
    # a copy (the caller's logits stay as they are) in float64, or float32 where ``lean``
    logits = sanitize_logits(logits.to(torch.float32 if lean else torch.float64, copy=rows is None))
    logits[:, banned] = float("-inf")  # never "reveal" a mask (or pad) token
    if warped:
        logits = torch.log(warp_logits(logits, 1.0, cfg.top_k, cfg.top_p).double())
    if cfg.temperature > 0:
        # the seeded generator is a CPU one (the same draws on every device); moved to the logits' device
        u = torch.rand(full.shape, generator=gen, dtype=torch.float64, device="cpu").clamp_(1e-300, 1.0)
        u = (u if rows is None else u[rows.cpu()]).to(logits.device)
        tokens = fast_argmax(logits / cfg.temperature - torch.log(-torch.log(u)))  # Gumbel-max
    else:
        tokens = fast_argmax(logits)
    dist = torch.softmax(logits, -1)
    if cfg.remasking == "random":
        confidence = torch.rand(full.shape[:1], generator=gen, dtype=torch.float64, device="cpu").to(tokens.device)
        confidence = confidence if rows is None else confidence[rows]
    else:
        confidence = dist.gather(-1, tokens[:, None])[:, 0].double()
    if rows is None:
        return tokens, confidence, dist if probs else None
    out_tokens = torch.zeros(full.shape[0], dtype=tokens.dtype, device=tokens.device)
    out_conf = confidence.new_zeros(full.shape[0])
    out_tokens[rows], out_conf[rows] = tokens, confidence
    if not probs:
        return out_tokens, out_conf, None
    out_probs = dist.new_zeros(full.shape)
    out_probs[rows] = dist
    return out_tokens, out_conf, out_probs


def neighbours(x: torch.Tensor, lo: int, block_len: int, p_len: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens left and right of each block position on the canvas x (1, P + N); -1 where that neighbour is
    masked or outside the answer (the prompt, past the end)."""
    answer = torch.cat([x.new_full((1,), -1), x[0, p_len:], x.new_full((1,), -1)])  # answer position i at i + 1
    answer = torch.where(answer == mask_id, torch.full_like(answer, -1), answer)
    i = lo - p_len + 1  # the block's first position in ``answer``
    return answer[i - 1:i - 1 + block_len], answer[i + 1:i + 1 + block_len]


@functools.lru_cache(maxsize=4)
def word_table(tokenizer, vocab: int) -> Words:
    """Which of the model's ``vocab`` tokens spell one word (unmasking.Words), from each token's text; ids past the
    tokenizer's are no words."""
    n = min(vocab, len(tokenizer))
    return Words.of(tokenizer.batch_decode([[i] for i in range(n)]) + [""] * (vocab - n))


def _takes(model: nn.Module, argument: str) -> bool:
    return argument in inspect.signature(model.forward).parameters


def takes_kv_cache(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") and _takes(model, "past_key_values")


def resolve_cache(model: nn.Module, cache: str | None) -> str:
    """The cache a decode uses: the option, or (None) DEFAULT_CACHE where the model takes a KV cache and
    its code is transformers' own (remote-code denoisers, Dream and LLaDA, were never run here: none)."""
    if cache is None:
        return DEFAULT_CACHE if takes_kv_cache(model) else "none"
    if cache != "none" and not _takes(model, "past_key_values"):
        raise ExplorerError(f"cache {cache!r} needs a diffusion model that takes a KV cache (past_key_values); "
                            f"{type(model).__name__} does not: use cache 'none'")
    return cache


def denoise(model: nn.Module, x: torch.Tensor, start: int, end: int, rows: list[int],
            cache: DynamicCache | None = None, fill: bool = False) -> tuple[torch.Tensor, float, int]:
    """One denoiser pass feeding x[:, start:end] (the other positions' keys and values come from
    ``cache``, which is cropped back afterwards unless ``fill``); logits (len(rows), V) of the
    absolute ``rows``."""
    rel = torch.tensor(rows, device=x.device) - start
    positions = {}
    if cache is not None:
        cached = cache.get_seq_length()
        positions["position_ids"] = torch.arange(start, end, device=x.device)[None]
    keep = rel if _takes(model, "logits_to_keep") else None
    logits, dt = timed_forward(model, x[:, start:end], cache, keep=keep, **positions)
    if cache is not None and not fill:
        cache.crop(cached - cache.get_seq_length())  # drop the fed positions (a negative count)
    return (logits[0] if keep is not None else logits[0, rel]).float(), dt, end - start  # a bf16 model: fp32 scores


def fill_cache(model: nn.Module, x: torch.Tensor, start: int, end: int,
               rows: list[int], store: list | None = None) -> tuple[torch.Tensor, float, int, DynamicCache]:
    """A full pass over x; also returns the keys and values of every position outside [start, end). ``store``: a
    list that receives every layer's keys and values of the whole canvas (``refresh_window`` updates them)."""
    full = DynamicCache()
    logits, dt, fed = denoise(model, x, 0, x.shape[1], rows, full, fill=True)
    layers = [(layer.keys, layer.values) for layer in full.layers]
    if store is not None:
        store[:] = layers
    return logits, dt, fed, cache_outside(layers, start, end)


def cache_outside(layers: list, start: int, end: int) -> DynamicCache:
    """A cache of the keys and values (``layers``: a (keys, values) pair a layer, over the whole canvas in position
    order) of every position outside [start, end)."""
    kept = DynamicCache()
    with torch.inference_mode():
        for i, (keys, values) in enumerate(layers):
            kept.update(torch.cat([keys[:, :, :start], keys[:, :, end:]], 2),
                        torch.cat([values[:, :, :start], values[:, :, end:]], 2), i)
    return kept


def refresh_window(model: nn.Module, x: torch.Tensor, store: list, refresh: int, start: int, end: int,
                   rows: list[int]) -> tuple[torch.Tensor, float, int, DynamicCache]:
    """Option cache "delayed" (after dKV-Cache, Ma et al. 2025: a token's keys and values are cached once it is
    decoded, a step late): a block's first pass feeds x[refresh:end] (the block just finished and this one) against
    the stored keys and values of everything else; the finished block's new ones, [refresh, start), replace the
    stored ones, and the cache for the block's other passes is every position outside [start, end)."""
    window = cache_outside(store, refresh, end)
    logits, dt, fed = denoise(model, x, refresh, end, rows, window, fill=True)
    with torch.inference_mode():
        for (keys, values), layer in zip(store, window.layers, strict=True):
            fresh = slice(layer.keys.shape[2] - (end - refresh), layer.keys.shape[2] - (end - start))
            keys[:, :, refresh:start], values[:, :, refresh:start] = layer.keys[:, :, fresh], layer.values[:, :, fresh]
    return logits, dt, fed, cache_outside(store, start, end)


def answer_ended(x: torch.Tensor, p_len: int, mask_id: int, eos: int | None) -> bool:
    """True once an end-of-turn token is revealed and every position before it is filled: the output (cut at
    the first EOS) can no longer change, so the rest of the canvas need not be decoded."""
    answer = x[0, p_len:]
    if eos is None:
        return False
    ends = (answer == eos).nonzero()
    return bool(len(ends)) and not bool((answer[:int(ends[0, 0])] == mask_id).any())


def decode_diffusion(models: Models, prompt_ids: list[int], cfg: DecodeConfig, refresh_every_step: bool = False,
                     stop_at_end: bool = True) -> Generator[Event, None, DecodeResult]:
    """Yield a RefinementStep per denoiser pass; return the DecodeResult (tokens, times, counters).

    ``refresh_every_step`` (a check of the cached path): refill the cache before every step and
    still take that step's logits from the cached pass; the output then equals ``cache="none"``.
    ``stop_at_end``: stop once the answer has ended (``answer_ended``) instead of filling the canvas with end
    tokens; the output is the same, with fewer passes.
    """
    t0 = time.perf_counter()
    if models.diffusion is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no diffusion model")
    own = diffusion_sampler(models.diffusion)  # a family's own sampler (Gemma's block diffusion), by registration
    if own is not None:
        return (yield from own.decode(models, prompt_ids, cfg))
    mask_id = models.mask_token_id
    if mask_id is None:
        raise ExplorerError("the diffusion model's tokenizer has no mask token")
    gen = make_generator(cfg.seed)
    n, block_len = cfg.max_new_tokens, cfg.diffusion_block_length
    blocks = n // block_len
    steps_per_block = cfg.diffusion_steps // blocks
    p_len = len(prompt_ids)
    x = torch.tensor([prompt_ids + [mask_id] * n], device=models.device)  # (1, P + N)
    eos = models.diffusion_tokenizer.eos_token_id
    # never "reveal" a mask or pad token; but where pad doubles as end-of-turn (SmolLM2) EOS stays allowed
    banned = [i for i in {mask_id, models.diffusion_tokenizer.pad_token_id} if i is not None and i != eos]
    free = frozenset(i for i in (eos, models.diffusion_tokenizer.pad_token_id) if i is not None)  # may repeat
    model, mode, shift, total = models.diffusion, resolve_cache(models.diffusion, cfg.cache), \
        int(bool(models.diffusion_shift)), p_len + n
    revealed_t = [0.0] * n
    passes, forward_s, step, fed_total = 0, 0.0, 0, 0
    store: list = []  # option "delayed": every layer's keys and values of the whole canvas, as last fed
    banning = bool(cfg.no_adjacent_repeat or cfg.no_repeat_ngram)  # a ban may take tokens out of a pass's logits
    for block in range(blocks):
        if stop_at_end and answer_ended(x, p_len, mask_id, eos):
            break
        lo = p_len + block * block_len  # absolute start of the block
        rows = list(range(lo - shift, lo + block_len - shift))  # the logits that predict the block
        start, end = lo - shift, (total if mode == "prefix" else lo + block_len)  # what a cached pass feeds
        schedule = reveal_schedule(block_len, steps_per_block)
        s, cache = 0, None
        refresh = max(p_len, lo - block_len) - shift  # option "delayed": the finished block, refed with this one
        revoked = torch.zeros(block_len, dtype=torch.bool, device=x.device)  # masked again by a pass of this block
        while bool((x[0, lo:lo + block_len] == mask_id).any()) and not (
                stop_at_end and answer_ended(x, p_len, mask_id, eos)):
            if mode == "none":
                logits, dt, fed = denoise(model, x, 0, total, rows)
            elif mode == "delayed" and cache is None and store and not refresh_every_step:
                logits, dt, fed, cache = refresh_window(model, x, store, refresh, start, end, rows)
            elif cache is None or refresh_every_step:  # the block's first step: a full pass fills the cache
                logits, dt, fed, cache = fill_cache(model, x, start, end, rows, store)
                if refresh_every_step:
                    logits, dt2, fed2 = denoise(model, x, start, end, rows, cache)
                    dt, fed = dt + dt2, fed + fed2
            else:
                logits, dt, fed = denoise(model, x, start, end, rows, cache)
            likeliest, answer, phrases, words = fast_argmax(logits), None, {}, None
            before = x[0, lo:lo + block_len].clone()
            still = before == mask_id
            live = torch.ones_like(still) if cfg.sampler == "revoke" else still  # the rows a sampler reads
            b0 = lo - p_len  # the block's first position in the answer
            canvas = [-1 if t == mask_id else t for t in x[0, p_len:].tolist()] \
                if banning else []  # the answer, -1 where masked
            if banning:
                logits = logits.clone()  # one copy the bans write into (the forward's own is an inference tensor)
            if cfg.no_adjacent_repeat:  # never a filled neighbour's word (unmasking.py)
                left, right = (torch.where(live, side, -1) for side in neighbours(x, lo, block_len, p_len, mask_id))
                words = word_table(models.diffusion_tokenizer, logits.shape[-1])
                logits = ban_repeats(logits, left, right, words, inplace=True)
                far = [(across_punctuation(canvas, b0 + i, -1, words), across_punctuation(canvas, b0 + i, 1, words))
                       if canvas[b0 + i] < 0 else (-1, -1) for i in range(block_len)]  # "plants, plants"
                bridges = [canvas[b0 + i] < 0 and bridges_repeat(canvas, b0 + i, words) for i in range(block_len)]
                logits = ban_words(logits, far, words, bridges, inplace=True) \
                    if any(a >= 0 or b >= 0 for a, b in far) or any(bridges) else logits
            if cfg.no_repeat_ngram:  # never a token that completes an n-gram the answer holds (unmasking.py)
                answer = canvas
                bans = ngram_bans(answer, range(lo - p_len, lo - p_len + block_len), cfg.no_repeat_ngram, free)
                for i, hit in bans.items():
                    logits[i - (lo - p_len), list(hit)] = float("-inf")
                    if int(likeliest[i - (lo - p_len)]) in hit:  # the phrase the likeliest token would repeat
                        answer[i] = int(likeliest[i - (lo - p_len)])
                        phrases[i - (lo - p_len)] = repeated_ngram(answer, i, cfg.no_repeat_ngram, free)
                        answer[i] = -1
            # a position whose likeliest token a ban took out (after a ban, never the token revealed)
            repeats = torch.isneginf(logits.gather(-1, likeliest[:, None])[:, 0]) if banning else None
            tokens, confidence, probs = predict_tokens(logits, cfg, gen, banned, live, cfg.sampler in READS_PROBS)
            count = schedule[s] if s < len(schedule) else 1
            plan = plan_pass(Pass(tokens, confidence, probs, still, before, count, ~still & ~revoked,
                                  None if answer is None else tuple(answer), lo - p_len, free, words), cfg)
            reveal, remask = list(plan.reveal), list(plan.remask)
            if not reveal or not all(bool(still[i]) for i in reveal) or len(remask) > len(reveal) or any(
                    bool(still[i]) or bool(revoked[i]) for i in remask):  # else a pass could loop forever
                raise ExplorerError(f"diffusion pass {step + 1} (block {block + 1}): the {cfg.sampler} sampler "
                                    f"revealed {len(reveal)} and re-masked {len(remask)} positions; a pass must "
                                    "reveal masked positions and re-mask at most as many revealed ones, each once")
            revoked[remask] = True
            x[0, [lo + i for i in reveal]] = tokens[reveal]
            x[0, [lo + i for i in remask]] = mask_id
            now = time.perf_counter()
            for i in reveal:
                revealed_t[block * block_len + i] = now - t0
            avoided = [] if repeats is None else [(i, int(likeliest[i])) for i in reveal if bool(repeats[i])]
            passes, forward_s, s, step, fed_total = passes + 1, forward_s + dt, s + 1, step + 1, fed_total + fed
            yield RefinementStep(t=now, step=step - 1, block=block,
                                 positions=tuple(block * block_len + i for i in reveal),
                                 tokens=tuple(int(tokens[i]) for i in reveal),
                                 confidences=tuple(float(confidence[i]) for i in reveal),
                                 masks_left=int((x[0, p_len:] == mask_id).sum()), forward_s=dt, fed_tokens=fed,
                                 remasked=tuple(block * block_len + i for i in remask),
                                 remasked_tokens=tuple(int(before[i]) for i in remask),
                                 remask_confidences=tuple(float(probs[i, before[i]]) for i in remask), why=plan.why,
                                 held=tuple(block * block_len + i for i in plan.held),
                                 held_tokens=tuple(int(tokens[i]) for i in plan.held),
                                 avoided=tuple(block * block_len + i for i, _ in avoided),
                                 avoided_tokens=tuple(t for _, t in avoided),
                                 avoided_phrases=tuple(phrases.get(i, ()) for i, _ in avoided))
    out = x[0, p_len:].tolist()
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    # A streaming client can show token i once tokens 0..i are all final.
    times, latest = [], 0.0
    for pos in range(len(out)):
        latest = max(latest, revealed_t[pos])
        times.append(latest)
    return DecodeResult(t0=t0, tokens=out, times=times, target_passes=passes, target_forward_s=forward_s,
                        cache=mode, fed_tokens=fed_total)
