"""Evaluation of the tiny family: held-out loss and bits per byte of the target and draft, their agreement,
the diffusion model's NELBO, and forward latencies."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from explorer.training.tiny.recipes import diffusion_loss


# ----------------------------------------------------------------------- evaluation
def eval_windows(stream: torch.Tensor, seq_len: int, limit: int) -> torch.Tensor:
    """Non-overlapping held-out windows, evenly spread over the held-out stream."""
    n = len(stream) // seq_len
    idx = torch.linspace(0, n - 1, steps=min(limit, n)).long().unique()
    return torch.stack([stream[i * seq_len: (i + 1) * seq_len] for i in idx.tolist()]).long()


def evaluate_ar(target, draft, windows, byte_table, unigram_logp) -> dict:
    """Held-out bits per byte (target, draft, unigram baseline) and greedy agreement.

    Predicted tokens are positions 1..T-1 of each window (teacher-forced)."""
    nats = {"target": 0.0, "draft": 0.0, "unigram": 0.0}
    agree = total = 0
    n_bytes = 0.0
    with torch.no_grad():
        for x in windows.split(8):
            labels = x[:, 1:]
            n_bytes += byte_table[labels].sum().item()
            nats["unigram"] -= unigram_logp[labels].sum().item()
            argmax = {}
            for name, model in (("target", target), ("draft", draft)):
                logits = model(input_ids=x).logits[:, :-1]
                nats[name] += F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                              labels.reshape(-1), reduction="sum").item()
                argmax[name] = logits.argmax(-1)
            agree += (argmax["target"] == argmax["draft"]).sum().item()
            total += labels.numel()
    bpb = {f"{k}_bpb": v / math.log(2) / n_bytes for k, v in nats.items()}
    return bpb | {"draft_target_greedy_agreement": agree / total, "eval_tokens": total,
                  "eval_bytes": n_bytes, "bytes_per_token": n_bytes / total,
                  "target_ce_nats_per_token": nats["target"] / total,
                  "draft_ce_nats_per_token": nats["draft"] / total}


def unigram_logprobs(stream: torch.Tensor, vocab: int) -> torch.Tensor:
    """Add-one smoothed unigram log-probabilities from training token counts."""
    counts = torch.bincount(stream.long(), minlength=vocab).double() + 1
    return (counts / counts.sum()).log()


def evaluate_diffusion(model, windows, mask_id: int, byte_table) -> dict:
    """Held-out masked-diffusion loss (same objective, fixed seed) and per-t losses."""
    gen = torch.Generator().manual_seed(4)
    total, n = 0.0, 0
    with torch.no_grad():
        for x in windows.split(8):
            total += diffusion_loss(model, x, mask_id, gen).item() * x.numel()
            n += x.numel()
        per_t = {f"t={t}": masked_ce_at(model, windows[:32], mask_id, t) for t in (0.15, 0.5, 0.9)}
    nelbo = total / n
    bpt = byte_table[windows].mean().item()
    return {"heldout_nelbo_nats_per_token": nelbo, "heldout_nelbo_bpb": nelbo / math.log(2) / bpt,
            "heldout_masked_ce_nats_by_t": per_t}


def masked_ce_at(model, x, mask_id: int, t: float) -> float:
    """Mean CE (nats) on masked tokens when each token (but position 0) is masked w.p. t."""
    gen = torch.Generator().manual_seed(5)
    masked = torch.rand(x.shape, generator=gen) < t
    masked[:, 0] = False
    noisy = torch.where(masked, torch.full_like(x, mask_id), x)
    logits = model(input_ids=noisy).logits[:, :-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                         reduction="none")
    sel = masked[:, 1:].reshape(-1)
    return ce[sel].mean().item()


def measure_latency(model, n_new: int, reps: int, cache_len: int = 100) -> float:
    """Median ms of a batch-1 forward of ``n_new`` tokens on a KV cache of ``cache_len``."""
    gen = torch.Generator().manual_seed(6)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab - 3, (1, cache_len), generator=gen)
    times = []
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
        for _ in range(reps + 3):
            x = torch.randint(0, vocab - 3, (1, n_new), generator=gen)
            t0 = time.perf_counter()
            model(input_ids=x, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache.crop(-n_new)
    times = sorted(times[3:])
    return round(1000 * times[len(times) // 2], 3)


def measure_full_latency(model, seq_len: int, reps: int) -> float:
    """Median ms of a batch-1 full (no-cache) forward of ``seq_len`` tokens."""
    x = torch.randint(0, model.config.vocab_size - 3, (1, seq_len),
                      generator=torch.Generator().manual_seed(7))
    times = []
    with torch.no_grad():
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            model(input_ids=x)
            times.append(time.perf_counter() - t0)
    times = sorted(times[2:])
    return round(1000 * times[len(times) // 2], 3)
