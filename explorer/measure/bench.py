"""``python -m explorer bench``: prompt sets x methods x configs x repeats, sweeps, a peer comparison.

Requests are timed exclusively: one at a time in this process, never two decoders on the
same cores at once. Configs run round-robin within each prompt (AR, speculative, diffusion,
AR, ...) so slow drift in background load reaches every config alike. A warm-up request per
config runs first and is not recorded. Quality (perplexity under the target, token entropy)
is scored after the timed region.

Speedups are tokens/s ratios against the autoregressive config of the same prompt set (and
the same temperature or length in a sweep). Predictions say which model they come from:
"Thm 3.8" is Leviathan et al. 2023, Thm 3.8, with alpha fitted to the measured acceptance
rate and c = draft pass / target pass; "forward times" divides the measured tokens per
verify step by the measured forward time per step (draft passes + one verify pass) over the
autoregressive step time: what the speedup would be if forward passes were the only cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import torch
from tqdm import tqdm

import explorer
from explorer.decoding.api import encode_prompt, make_config
from explorer.decoding.config import DecodeConfig
from explorer.decoding.events import Proposal, RefinementStep, TokenStep, Trace, Verification
from explorer.errors import ExplorerError
from explorer.measure import progress
from explorer.measure.metrics import (
    PERCENTILES,
    inter_token_latencies,
    percentile,
    predicted_speedup,
    request_row,
    summarize,
)
from explorer.measure.workload import QUALITY_COLUMNS, PromptSet, ignoring_eos, score_quality
from explorer.runtime import Models

SWEEPS = ("bench", "gamma", "temperature", "drafter", "drafter_gamma", "diffusion", "cache", "batch", "memory")
METHOD_OPTIONS = {
    "autoregressive": ("max_new_tokens", "temperature", "seed"),
    "speculative": ("max_new_tokens", "temperature", "seed", "gamma", "drafter", "cache", "draft_confidence"),
    "diffusion": ("max_new_tokens", "temperature", "seed", "steps", "block_length", "cache", "threshold"),
}
GAMMAS = (1, 2, 3, 4, 6, 8)
TEMPERATURES = (0.0, 0.5, 1.0, 1.5)
LENGTHS = (16, 32, 64, 128, 256)
CACHE_LENGTHS = (64, 128, 256)
DRAFT_GAMMAS = (2, 4, 8)
CACHE_BLOCK = 32  # the block length of the cached sweeps (Fast-dLLM's default)
K_DIVISORS = (2, 4, 8, 16)  # diffusion steps K = N / d
BATCHES = (1, 2, 4, 8, 16, 32)


@dataclass
class BenchSettings:
    """Everything a run needs besides the models and prompts (the CLI fills it from its flags)."""

    max_new_tokens: int = DecodeConfig.max_new_tokens
    temperature: float = DecodeConfig.temperature
    gamma: int | None = None  # None: the preset's
    drafter: str = DecodeConfig.drafter
    steps: int | None = None
    block_length: int | None = None
    cache: str | None = None  # diffusion KV cache; None: the default (config.DEFAULT_CACHE)
    seed: int = DecodeConfig.seed
    repeats: int = 1
    warmup: int = 1
    ignore_eos: bool = False
    quality: bool = True
    progress: bool = True


@dataclass(frozen=True)
class RunConfig:
    method: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)  # override the BenchSettings values
    group: str = ""  # speedups compare against the autoregressive config of the same group
    x: Any = None  # the swept value, for plots


# ---------------------------------------------------------------------------------------------
# requests

def preset_chain(models: Models | None, gamma: int | None, drafter: str) -> tuple[int, float | None, str]:
    """(γ, draft_confidence, label) of the speculative config a measurement runs: what ``explorer.decode`` would
    run with this γ (None: the preset's) and drafter, so with no γ given and the preset's drafter the preset's own
    chain (its γ the longest draft, cut where the draft gets unlikely: the rule in ``api.make_config``)."""
    if models is None:
        gamma, cut = gamma or 4, None
    else:
        cfg = make_config("speculative", models, {"drafter": drafter, **({"gamma": gamma} if gamma else {})})
        gamma, cut = cfg.gamma, cfg.draft_confidence
    shape = f"γ≤{gamma}, cut {cut:g}" if cut else f"γ={gamma}"
    return gamma, cut, f"speculative[{drafter}, {shape}]"


def plain_configs(methods: list[str], s: BenchSettings, models: Models | None = None) -> list[RunConfig]:
    """One config per method, from the settings (the plain bench)."""
    configs = []
    for method in methods:
        if method == "speculative":
            gamma, cut, label = preset_chain(models, s.gamma, s.drafter)
            configs.append(RunConfig(method, label, {"gamma": gamma, "draft_confidence": cut}))
        elif method == "diffusion":
            steps = s.steps or s.max_new_tokens
            block = f", block={s.block_length}" if s.block_length else ""
            cache = f", cache={s.cache}" if s.cache else ""
            configs.append(RunConfig(method, f"diffusion[K={steps}{block}{cache}]", {"steps": steps}))
        else:
            configs.append(RunConfig(method, method))
    return configs


def decode_options(cfg: RunConfig, s: BenchSettings, prompt_temperature: float | None, repeat: int) -> dict[str, Any]:
    """The keyword options of one request: settings, then the config's, then the prompt's temperature."""
    base = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "seed": s.seed + repeat,
            "gamma": s.gamma, "drafter": s.drafter, "steps": s.steps, "block_length": s.block_length,
            "cache": s.cache}
    options = {k: v for k, v in {**base, **cfg.options}.items() if k in METHOD_OPTIONS[cfg.method]}
    if prompt_temperature is not None and "temperature" not in cfg.options:
        options["temperature"] = prompt_temperature
    return options


def run_requests(models: Models, sets: list[PromptSet], configs: list[RunConfig], s: BenchSettings,
                 desc: str = "bench") -> pd.DataFrame:
    """One row per request (see ``request_row``) plus prompt, config, memory, forward profile, quality."""
    run_models = ignoring_eos(models) if s.ignore_eos else models
    sets = fit_prompts(models, sets, configs, s)
    first = sets[0].prompts[0]
    for cfg in configs:
        for _ in range(s.warmup):
            explorer.decode(cfg.method, run_models, first.text, **decode_options(cfg, s, first.temperature, 0))
    tasks = [(r, ps, p, cfg) for r in range(s.repeats) for ps in sets for p in ps.prompts for cfg in configs]
    rows, started = [], time.perf_counter()
    for i, (repeat, prompt_set, prompt, cfg) in enumerate(tqdm(tasks, desc=desc, unit="req", file=sys.stderr,
                                                               disable=not s.progress, dynamic_ncols=True)):
        progress.tell(i, len(tasks), f"{desc}: request {i + 1} of {len(tasks)}, the {cfg.method} lane", started)
        options = decode_options(cfg, s, prompt.temperature, repeat)
        reset = _reset_peak_memory(models.device)
        trace = explorer.decode(cfg.method, run_models, prompt.text, **options)
        memory, kind = _peak_memory(models.device, reset)
        quality = score_quality(models, trace) if s.quality else {}
        rows.append(request_row(trace, config=cfg.label, group=cfg.group, x=cfg.x, prompt_set=prompt_set.name,
                                prompt_id=prompt.id, repeat=repeat, proposed=trace.stats["proposed"],
                                accepted=trace.stats["accepted"], peak_memory_bytes=memory, memory_kind=kind,
                                cache=trace.stats.get("cache"), fed_per_pass=trace.stats.get("fed_tokens_per_pass"),
                                token_ids=tuple(trace.token_ids),
                                **forward_profile(trace), **quality, itl_s=inter_token_latencies(trace)))
    return pd.DataFrame(rows)


def fit_prompts(models: Models, sets: list[PromptSet], configs: list[RunConfig], s: BenchSettings) -> list[PromptSet]:
    """Drop prompts too long for some config's context (with a notice); none left is an error."""
    kept_sets = []
    for ps in sets:
        kept = tuple(p for p in ps.prompts if all(_fits(models, p.text, cfg, s) for cfg in configs))
        if len(kept) < len(ps.prompts):
            print(f"notice: {ps.name}: skipped {len(ps.prompts) - len(kept)} of {len(ps.prompts)} prompts too long "
                  "for the model's context at the longest configuration", file=sys.stderr)
        if kept:
            kept_sets.append(dataclasses.replace(ps, prompts=kept))
    if not kept_sets:
        raise ExplorerError("every prompt is too long for the model's context with this many new tokens; "
                            "use shorter prompts or a smaller --max-new-tokens")
    return kept_sets


def _fits(models: Models, prompt: str, cfg: RunConfig, s: BenchSettings) -> bool:
    """The check api.stream makes: prompt + max_new_tokens (+ gamma + 1 for speculative) within the context."""
    options = decode_options(cfg, s, None, 0)
    diffusion = cfg.method == "diffusion"
    tokenizer = models.diffusion_tokenizer if diffusion else models.tokenizer
    extra = (options.get("gamma") or models.preset.gamma) + 1 if cfg.method == "speculative" else 0
    prompt_tokens = len(encode_prompt(tokenizer, prompt, models.preset.chat)[0])
    return prompt_tokens + options["max_new_tokens"] + extra <= _context(models.diffusion if diffusion
                                                                         else models.target)


def forward_profile(trace: Trace) -> dict[str, float]:
    """Mean forward time per decode step (prefill excluded) and per draft pass; steps; overhead."""
    steps = [e for e in trace.events if isinstance(e, (Verification, RefinementStep))]
    if trace.method == "autoregressive":
        steps = [e for e in trace.events if isinstance(e, TokenStep)][1:]  # step 0 is the prefill
    proposals = [e for e in trace.events if isinstance(e, Proposal)]
    draft_passes = sum(p.draft_passes for p in proposals)
    s = trace.stats
    return {
        "step_forward_s": float(np.mean([e.forward_s for e in steps])) if steps else float("nan"),
        "draft_pass_s": sum(p.forward_s for p in proposals) / draft_passes if draft_passes else float("nan"),
        "decode_steps": len(steps),
        "overhead_s": s["wall_s"] - s["target_forward_s"] - s["draft_forward_s"],
    }


def _reset_peak_memory(device: torch.device) -> bool:
    """CUDA: reset the allocator's peak. Linux: reset the RSS high-water mark (VmHWM)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_memory(device: torch.device, reset: bool) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    if reset:
        with contextlib.suppress(OSError), open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "peak_rss"
    return int(psutil.Process().memory_info().rss), "rss_after"  # no resettable peak here


# ---------------------------------------------------------------------------------------------
# summaries

def fit_alpha(acceptance_rate: float, gamma: float) -> float:
    """The per-token acceptance alpha whose i.i.d. model gives this rate: sum_i a^i / gamma = rate."""
    if not math.isfinite(acceptance_rate) or gamma <= 0:
        return float("nan")
    if acceptance_rate <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection; the rate is increasing in alpha
        mid = (lo + hi) / 2
        rate = sum(mid ** i for i in range(1, int(round(gamma)) + 1)) / round(gamma)
        lo, hi = (mid, hi) if rate < acceptance_rate else (lo, mid)
    return (lo + hi) / 2


def summarize_requests(frame: pd.DataFrame) -> pd.DataFrame:
    """Per prompt set and config: metrics.summarize plus pooled ITL, quality, speedup and predictions."""
    keys = ["prompt_set", "config"]
    table = summarize(frame, by=keys).drop(columns=[f"itl_p50_p{q}_s" for q in PERCENTILES])
    extra = []
    for (prompt_set, config), g in frame.groupby(keys, sort=False):
        gaps = [gap for gaps in g["itl_s"] for gap in gaps]
        proposed, steps = g["proposed"].sum(), g["decode_steps"].sum()
        row = {"prompt_set": prompt_set, "config": config, "method": g["method"].iloc[0], "group": g["group"].iloc[0],
               "x": g["x"].iloc[0], "gamma": g["gamma"].iloc[0],
               **{f"itl_p{q}_s": percentile(gaps, q) for q in PERCENTILES},
               "acceptance_rate_pooled": g["accepted"].sum() / proposed if proposed else float("nan"),
               "tokens_per_step": _emitted_by_steps(g) / steps if steps else float("nan"),
               "draft_passes_per_step": g["draft_forward_passes"].sum() / steps if steps else float("nan"),
               "step_forward_s": g["step_forward_s"].mean(), "draft_pass_s": g["draft_pass_s"].mean(),
               "overhead_per_token_s": g["overhead_s"].sum() / max(1, g["new_tokens"].sum())}
        for col in QUALITY_COLUMNS:
            if col in g:
                row[f"{col}_mean"] = g[col].mean()
        extra.append(row)
    table = table.merge(pd.DataFrame(extra), on=keys)
    return _add_speedups(table)


def _emitted_by_steps(g: pd.DataFrame) -> int:
    """New tokens made by the decode steps (autoregressive: the prefill pass makes the first one)."""
    return int(g["new_tokens"].sum()) - (len(g) if g["method"].iloc[0] == "autoregressive" else 0)


def _add_speedups(table: pd.DataFrame) -> pd.DataFrame:
    """Speedup against the autoregressive row of the same prompt set and group, and the predicted ones."""
    table = table.copy()
    for col in ("speedup", "cost_ratio_c", "verify_ratio", "alpha_fitted", "predicted_speedup_thm",
                "predicted_speedup_forward"):
        table[col] = float("nan")
    for i, row in table.iterrows():
        base = table[(table["prompt_set"] == row["prompt_set"]) & (table["group"] == row["group"])
                     & (table["method"] == "autoregressive")]
        if base.empty:
            continue
        ar = base.iloc[0]
        table.loc[i, "speedup"] = row["tokens_per_s"] / ar["tokens_per_s"]
        if row["method"] != "speculative":
            continue
        t_ar = ar["step_forward_s"]
        c = 0.0 if not math.isfinite(row["draft_pass_s"]) else row["draft_pass_s"] / t_ar
        gamma = float(row["gamma"])
        alpha = fit_alpha(row["acceptance_rate_pooled"], gamma)
        step_time = row["draft_passes_per_step"] * c + row["step_forward_s"] / t_ar  # in AR steps
        table.loc[i, ["cost_ratio_c", "verify_ratio", "alpha_fitted"]] = [c, row["step_forward_s"] / t_ar, alpha]
        table.loc[i, "predicted_speedup_thm"] = predicted_speedup(alpha, int(gamma), c) if math.isfinite(
            alpha) else float("nan")
        table.loc[i, "predicted_speedup_forward"] = row["tokens_per_step"] / step_time
    return table


SUMMARY_COLUMNS = [("requests", "n", 1), ("latency_p50_s", "lat p50 ms", 1e3), ("latency_p95_s", "lat p95", 1e3),
                   ("latency_p99_s", "lat p99", 1e3), ("ttft_p50_s", "ttft p50", 1e3), ("ttft_p95_s", "ttft p95", 1e3),
                   ("ttft_p99_s", "ttft p99", 1e3), ("itl_p50_s", "itl p50", 1e3), ("itl_p95_s", "itl p95", 1e3),
                   ("itl_p99_s", "itl p99", 1e3), ("acceptance_rate_pooled", "accept", 1),
                   ("tokens_per_target_pass", "tok/pass", 1), ("tokens_per_s", "tok/s", 1), ("speedup", "speedup", 1),
                   ("predicted_speedup_forward", "pred(fwd)", 1), ("perplexity_mean", "ppl", 1),
                   ("token_entropy_bits_mean", "H bits", 1), ("distinct_3_mean", "dist-3", 1),
                   ("repeat_rate_mean", "repeats", 1)]


def format_summary(table: pd.DataFrame) -> str:
    """The printed table: p50/p95/p99 of latency, TTFT and ITL (ms), acceptance, tokens/s, quality."""
    out = table[["prompt_set", "config"]].rename(columns={"prompt_set": "set"})
    for col, name, scale in SUMMARY_COLUMNS:
        if col in table:
            out[name] = [f"{v * scale:.3g}" if isinstance(v, (int, float)) and math.isfinite(v) else ""
                         for v in table[col]]
    return out.to_string(index=False)


def _context(model: torch.nn.Module | None) -> int:
    return int(getattr(model.config, "max_position_embeddings", None) or 2048) if model is not None else 10**9
