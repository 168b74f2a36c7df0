"""Costs the bench predicts from rather than decodes: forward-pass cost ratios by batch size (timed on
random ids with a KV cache), and the memory of weights and KV cache per configuration."""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm
from transformers import DynamicCache

from explorer.errors import ExplorerError
from explorer.measure.bench import BATCHES, BenchSettings, RunConfig, fit_alpha, run_requests
from explorer.measure.metrics import noise_flag, pass_spread, predicted_speedup
from explorer.measure.progress import tell
from explorer.measure.report import (
    Section,
    batch_figure,
    memory_figure,
)
from explorer.measure.workload import PromptSet
from explorer.runtime import Models, synchronize

# ---------------------------------------------------------------------------------------------
# batch size: cost ratios from timed forward passes on random ids with a KV cache

@torch.inference_mode()
def filled_cache(model: torch.nn.Module, batch: int, cache_len: int, gen: torch.Generator) -> DynamicCache:
    """A KV cache holding cache_len random tokens for each of batch sequences."""
    cache = DynamicCache()
    ids = torch.randint(0, model.config.vocab_size, (batch, cache_len), generator=gen).to(model.device)  # (B, L)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


@torch.inference_mode()
def pass_seconds(model: torch.nn.Module, cache: DynamicCache, batch: int, new_tokens: int,
                 gen: torch.Generator) -> float:
    """Seconds of one (batch, new_tokens) forward on the cache, which is cropped back afterwards."""
    ids = torch.randint(0, model.config.vocab_size, (batch, new_tokens), generator=gen).to(model.device)  # (B, n)
    synchronize(model.device)
    start = time.perf_counter()
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    synchronize(model.device)
    seconds = time.perf_counter() - start
    cache.crop(-new_tokens)
    return seconds


def batch_costs(models: Models, gamma: int, alpha: float, batches: tuple[int, ...] = BATCHES, cache_len: int = 128,
                reps: int = 10, progress: bool = True) -> pd.DataFrame:
    """For each B: target B x (gamma+1) vs B x 1, draft B x 1 (interleaved, median); c and the predicted speedup;
    ``pass_spread`` the widest (p90 - p10) / median of the three, ``noisy`` the flag when it is too wide."""
    if models.draft is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no draft model; the batch sweep times target vs draft")
    gen = torch.Generator().manual_seed(0)
    expected_tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1
    rows, started = [], time.perf_counter()
    for i, b in enumerate(tqdm(batches, desc="sweep batch", file=sys.stderr, disable=not progress)):
        tell(i, len(batches), f"the batch sweep: batch {b} ({i + 1} of {len(batches)})", started)
        target, draft = filled_cache(models.target, b, cache_len, gen), filled_cache(models.draft, b, cache_len, gen)
        times = [[pass_seconds(models.target, target, b, 1, gen),
                  pass_seconds(models.target, target, b, gamma + 1, gen),
                  pass_seconds(models.draft, draft, b, 1, gen)] for _ in range(reps + 2)]
        timed = np.array(times[2:])  # the first two rounds warm up
        t1, tv, td = np.median(timed, axis=0)
        c, v = td / t1, tv / t1
        rows.append({"batch": b, "cache_len": cache_len, "gamma": gamma, "target_pass_1_s": t1,
                     "target_pass_gamma1_s": tv, "draft_pass_1_s": td, "cost_ratio_c": c, "verify_ratio": v,
                     "alpha": alpha, "predicted_speedup_thm": predicted_speedup(alpha, gamma, c),
                     "predicted_speedup_forward": expected_tokens / (gamma * c + v),
                     "pass_spread": max(pass_spread(col) for col in timed.T), "noisy": noise_flag(*timed.T)})
    return pd.DataFrame(rows)


def batch_section(models: Models, sets: list[PromptSet], s: BenchSettings, acceptance: float | None = None,
                  batches: tuple[int, ...] = BATCHES, reps: int = 10) -> tuple[Section, pd.DataFrame]:
    gamma = s.gamma or models.preset.gamma
    source = "the bench in this run"
    if acceptance is None:
        configs = [RunConfig("speculative", f"speculative[model, γ={gamma}]", {"gamma": gamma, "drafter": "model"})]
        frame = run_requests(models, sets, configs, dataclasses.replace(s, quality=False), desc="acceptance")
        acceptance, source = frame["accepted"].sum() / max(1, frame["proposed"].sum()), "a batch-1 run on the prompts"
    alpha = fit_alpha(acceptance, gamma)
    frame = batch_costs(models, gamma, alpha, batches, reps=reps, progress=s.progress)
    notes = [f"Acceptance rate {acceptance:.3f} measured by {source} (model drafter, γ={gamma}); "
             f"alpha = {alpha:.3f} fitted to it. Forward passes on random token ids with a KV cache of "
             f"{frame['cache_len'].iloc[0]} tokens, median of {reps}.",
             "The speedups on this plot are PREDICTED from the measured costs and acceptance; a measured batched "
             "speculative run is not implemented (the decoders run batch 1)."]
    return Section("Batch size: cost ratio c and predicted speedup", [batch_figure(frame)], {"batch sweep": frame},
                   notes), frame


# ---------------------------------------------------------------------------------------------
# memory: weights and KV cache per configuration

def kv_cache_bytes(model: torch.nn.Module, batch: int, seq_len: int, layers: int | None = None) -> int:
    """2 (keys, values) x layers x kv heads x head dim x positions x batch x bytes per element."""
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * (layers or cfg.num_hidden_layers) * heads * head_dim * seq_len * batch * element


@torch.inference_mode()
def measured_kv_bytes(model: torch.nn.Module, seq_len: int = 32) -> int:
    """Bytes a real DynamicCache holds after a forward over seq_len tokens (checks the formula)."""
    cache = DynamicCache()
    model(input_ids=torch.zeros((1, seq_len), dtype=torch.long, device=model.device), past_key_values=cache,
          use_cache=True)
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def memory_table(models: Models, batches: tuple[int, ...] = (1, 8, 32), seq_lens: tuple[int, ...] | None = None,
                 early_exit_layers: int | None = None) -> pd.DataFrame:
    weights = models.memory_bytes()
    context = models.context_length
    seq_lens = seq_lens or (context // 2, context)
    target, draft = models.target, models.draft
    exit_layers = early_exit_layers or models.preset.early_exit_layers or max(1, target.config.num_hidden_layers // 3)
    rows = []
    for b in batches:
        for n in seq_lens:
            t_kv = kv_cache_bytes(target, b, n)
            configs = [("autoregressive", 0, 0), ("speculative[prompt_lookup]", 0, 0),
                       ("speculative[early_exit]", 0, kv_cache_bytes(target, b, n, exit_layers))]
            if draft is not None:
                configs.insert(1, ("speculative[model]", weights["draft"], kv_cache_bytes(draft, b, n)))
            for name, d_w, d_kv in configs:
                rows.append({"config": name, "batch": b, "seq_len": n, "target_weights_bytes": weights["target"],
                             "draft_weights_bytes": d_w, "target_kv_bytes": t_kv, "draft_kv_bytes": d_kv,
                             "diffusion_weights_bytes": 0})
            if models.diffusion is not None:
                rows.append({"config": "diffusion (no KV cache)", "batch": b, "seq_len": n, "target_weights_bytes": 0,
                             "draft_weights_bytes": 0, "target_kv_bytes": 0, "draft_kv_bytes": 0,
                             "diffusion_weights_bytes": weights["diffusion"]})
    frame = pd.DataFrame(rows)
    frame["total_bytes"] = frame[[c for c in frame if c.endswith("_bytes")]].sum(axis=1)
    return frame


def memory_section(models: Models) -> tuple[Section, pd.DataFrame]:
    frame = memory_table(models)
    formula, real = kv_cache_bytes(models.target, 1, 32), measured_kv_bytes(models.target, 32)
    notes = [f"KV cache bytes = 2 x layers x KV heads x head dim x positions x batch x bytes per element "
             f"(target, 32 positions: formula {formula} B, a real DynamicCache {real} B). Weights are counted "
             "once per model; early exit shares the target's weights. Diffusion recomputes the whole sequence "
             "each pass (activations, not a cache)."]
    return Section("Memory: weights and KV cache", [memory_figure(frame)], {"memory per configuration": frame},
                   notes), frame
