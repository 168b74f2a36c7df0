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

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm
from transformers import DynamicCache

import explorer
from explorer.decoding.api import encode_prompt
from explorer.decoding.config import CACHES, METHODS, SWEEP_CACHE, DecodeConfig, validate
from explorer.decoding.diffusion import resolve_cache
from explorer.decoding.drafters import available_drafters
from explorer.decoding.events import Proposal, RefinementStep, TokenStep, Trace, Verification
from explorer.decoding.flags import add_model_arguments, add_option_arguments, option_help
from explorer.errors import ExplorerError
from explorer.measure.metrics import (
    PERCENTILES,
    inter_token_latencies,
    percentile,
    predicted_speedup,
    request_row,
    summarize,
)
from explorer.measure.report import (
    Section,
    batch_figure,
    breakeven_figure,
    memory_figure,
    peer_figure,
    speed_quality_figure,
    sweep_figure,
    tail_latency_figure,
    throughput_figure,
    write_report,
)
from explorer.measure.workload import PromptSet, ignoring_eos, load_prompt_sets, score_quality
from explorer.models import Models, synchronize

SWEEPS = ("bench", "gamma", "temperature", "drafter", "drafter_gamma", "diffusion", "cache", "batch", "memory")
METHOD_OPTIONS = {
    "autoregressive": ("max_new_tokens", "temperature", "seed"),
    "speculative": ("max_new_tokens", "temperature", "seed", "gamma", "drafter", "cache"),
    "diffusion": ("max_new_tokens", "temperature", "seed", "steps", "block_length", "cache"),
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
class Settings:
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
    options: dict[str, Any] = field(default_factory=dict)  # override the Settings values
    group: str = ""  # speedups compare against the autoregressive config of the same group
    x: Any = None  # the swept value, for plots


# ---------------------------------------------------------------------------------------------
# requests

def plain_configs(methods: list[str], s: Settings, models: Models | None = None) -> list[RunConfig]:
    """One config per method, from the settings (the plain bench)."""
    configs = []
    for method in methods:
        if method == "speculative":
            gamma = s.gamma or (models.preset.gamma if models else 4)
            configs.append(RunConfig(method, f"speculative[{s.drafter}, γ={gamma}]", {"gamma": gamma}))
        elif method == "diffusion":
            steps = s.steps or s.max_new_tokens
            block = f", block={s.block_length}" if s.block_length else ""
            cache = f", cache={s.cache}" if s.cache else ""
            configs.append(RunConfig(method, f"diffusion[K={steps}{block}{cache}]", {"steps": steps}))
        else:
            configs.append(RunConfig(method, method))
    return configs


def decode_options(cfg: RunConfig, s: Settings, prompt_temperature: float | None, repeat: int) -> dict[str, Any]:
    """The keyword options of one request: settings, then the config's, then the prompt's temperature."""
    base = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "seed": s.seed + repeat,
            "gamma": s.gamma, "drafter": s.drafter, "steps": s.steps, "block_length": s.block_length,
            "cache": s.cache}
    options = {k: v for k, v in {**base, **cfg.options}.items() if k in METHOD_OPTIONS[cfg.method]}
    if prompt_temperature is not None and "temperature" not in cfg.options:
        options["temperature"] = prompt_temperature
    return options


def run_requests(models: Models, sets: list[PromptSet], configs: list[RunConfig], s: Settings,
                 desc: str = "bench") -> pd.DataFrame:
    """One row per request (see ``request_row``) plus prompt, config, memory, forward profile, quality."""
    run_models = ignoring_eos(models) if s.ignore_eos else models
    sets = fit_prompts(models, sets, configs, s)
    first = sets[0].prompts[0]
    for cfg in configs:
        for _ in range(s.warmup):
            explorer.decode(cfg.method, run_models, first.text, **decode_options(cfg, s, first.temperature, 0))
    tasks = [(r, ps, p, cfg) for r in range(s.repeats) for ps in sets for p in ps.prompts for cfg in configs]
    rows = []
    for repeat, prompt_set, prompt, cfg in tqdm(tasks, desc=desc, unit="req", file=sys.stderr,
                                                disable=not s.progress, dynamic_ncols=True):
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


def fit_prompts(models: Models, sets: list[PromptSet], configs: list[RunConfig], s: Settings) -> list[PromptSet]:
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


def _fits(models: Models, prompt: str, cfg: RunConfig, s: Settings) -> bool:
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
    import psutil

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
        for col in ("perplexity", "token_entropy_bits"):
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
                   ("token_entropy_bits_mean", "H bits", 1)]


def format_summary(table: pd.DataFrame) -> str:
    """The printed table: p50/p95/p99 of latency, TTFT and ITL (ms), acceptance, tokens/s, quality."""
    out = table[["prompt_set", "config"]].rename(columns={"prompt_set": "set"})
    for col, name, scale in SUMMARY_COLUMNS:
        if col in table:
            out[name] = [f"{v * scale:.3g}" if isinstance(v, (int, float)) and math.isfinite(v) else ""
                         for v in table[col]]
    return out.to_string(index=False)


# ---------------------------------------------------------------------------------------------
# the plain bench and the sweeps (each returns a report section and its rows)

def bench_section(models: Models, sets: list[PromptSet], methods: list[str],
                  s: Settings) -> tuple[Section, pd.DataFrame]:
    frame = run_requests(models, sets, plain_configs(methods, s, models), s)
    table = summarize_requests(frame)
    figures = [tail_latency_figure(frame), throughput_figure(table)]
    if s.quality:
        figures.append(speed_quality_figure(table))
    section = Section("Requests: latency, TTFT, inter-token latency, acceptance, quality", figures,
                      {"summary per prompt set and config": table.drop(columns=["group", "x"])},
                      [_bench_note(s), "ITL percentiles pool every gap between consecutive tokens of every request; "
                       "a speculative step emits a burst, so many gaps are ~0 and the tail holds the verify steps."])
    return section, frame


def _bench_note(s: Settings) -> str:
    eos = "EOS ignored: every request makes exactly max_new_tokens" if s.ignore_eos else "requests stop at EOS"
    return (f"max_new_tokens={s.max_new_tokens}, temperature={s.temperature} (a prompt's own temperature wins), "
            f"repeats={s.repeats} (seed + repeat), warm-up={s.warmup} per config, {eos}; one request at a time.")


def sweep_section(kind: str, models: Models, sets: list[PromptSet], s: Settings,
                  values: tuple | None = None) -> tuple[Section, pd.DataFrame]:
    """gamma / temperature / drafter: speculative configs next to their autoregressive baselines."""
    drafters = available_drafters(models)
    gamma = s.gamma or models.preset.gamma
    if kind == "gamma":
        configs = [RunConfig("autoregressive", "autoregressive")] + [
            RunConfig("speculative", f"speculative[{s.drafter}, γ={g}]", {"gamma": g}, x=g) for g in values or GAMMAS]
    elif kind == "drafter_gamma":  # every drafter (the diffusion one where it applies) at each gamma
        usable = drafters
        configs = [RunConfig("autoregressive", "autoregressive")] + [
            RunConfig("speculative", f"speculative[{d}, γ={g}]", {"drafter": d, "gamma": g}, x=g)
            for g in values or DRAFT_GAMMAS for d in usable]
    elif kind == "temperature":
        configs = [c for t in values or TEMPERATURES for c in (
            RunConfig("autoregressive", f"autoregressive T={t}", {"temperature": t}, f"T={t}", t),
            RunConfig("speculative", f"speculative[{s.drafter}, γ={gamma}] T={t}", {"temperature": t, "gamma": gamma},
                      f"T={t}", t))]
    else:
        configs = [RunConfig("autoregressive", "autoregressive")] + [
            RunConfig("speculative", f"speculative[{d}, γ={gamma}]", {"drafter": d, "gamma": gamma}, x=d)
            for d in values or drafters]
    frame = run_requests(models, sets, configs, s, desc=f"sweep {kind}")
    table = summarize_requests(frame)
    x_title = {"gamma": "γ (drafted tokens per step)", "temperature": "temperature", "drafter": "drafter",
               "drafter_gamma": "γ (drafted tokens per step)"}[kind]
    fig = sweep_figure(table, "x", x_title, f"Speculative decoding against {x_title}")
    cols = ["prompt_set", "config", "requests", "latency_p50_s", "latency_p99_s", "tokens_per_s", "speedup",
            "tokens_per_target_pass", "acceptance_rate_pooled", "alpha_fitted", "cost_ratio_c", "verify_ratio",
            "tokens_per_step",
            "predicted_speedup_thm", "predicted_speedup_forward", "perplexity_mean", "token_entropy_bits_mean"]
    notes = [_bench_note(s), "Measured speedup is a tokens/s ratio; both predictions use this run's measured "
             "acceptance and forward times (see the module docstring of explorer/measure/bench.py)."]
    return Section(f"Sweep: {kind}", [fig], {f"{kind} sweep": table[[c for c in cols if c in table]]}, notes), frame


def diffusion_section(models: Models, sets: list[PromptSet], s: Settings, lengths: tuple[int, ...] = LENGTHS,
                      divisors: tuple[int, ...] = K_DIVISORS) -> tuple[Section, pd.DataFrame]:
    """Latency against output length N for AR, speculative and diffusion at K = N/d: the break-even plot."""
    gamma = s.gamma or models.preset.gamma
    cache = resolve_cache(models.diffusion, s.cache or SWEEP_CACHE) if models.diffusion is not None else "none"
    configs = []
    for n in lengths:
        opts = {"max_new_tokens": n}
        block = min(n, s.block_length or CACHE_BLOCK) if cache != "none" else None
        configs += [RunConfig("autoregressive", f"autoregressive N={n}", opts, f"N={n}", n),
                    RunConfig("speculative", f"speculative γ={gamma} N={n}", {**opts, "gamma": gamma}, f"N={n}", n)]
        configs += [RunConfig("diffusion", f"diffusion K=N/{d} N={n}", {**opts, "steps": n // d, "block_length": block,
                                                                        "cache": cache}, f"N={n}", n)
                    for d in divisors if n // d >= 1 and (n // d) % (n // (block or n)) == 0]
        if cache != "none" and 4 in divisors:  # the same K without a cache (one block), for comparison
            configs.append(RunConfig("diffusion", f"diffusion K=N/4 no cache N={n}",
                                     {**opts, "steps": n // 4, "block_length": None, "cache": "none"}, f"N={n}", n))
    fixed = dataclasses.replace(s, ignore_eos=True)
    frame = run_requests(models, sets, configs, fixed, desc="sweep diffusion")
    frame["series"] = frame["config"].str.replace(r" N=\d+$", "", regex=True)
    points = (frame.groupby(["series", "x"], sort=False)
              .agg(method=("method", "first"), requests=("latency_s", "size"), latency_p50_s=("latency_s", "median"),
                   latency_p99_s=("latency_s", lambda v: percentile(v, 99)), target_passes=("target_forward_passes",
                                                                                            "mean"))
              .reset_index().rename(columns={"x": "n"}))
    crossings = find_all_crossings(points)
    how = ("one block of N, K = N/d denoiser passes over prompt + N tokens (no KV cache)" if cache == "none" else
           f"blocks of min(N, {s.block_length or CACHE_BLOCK}), K = N/d passes, KV cache '{cache}'; the series "
           "'K=N/4 no cache' is one block of N with every pass over prompt + N tokens")
    notes = [_breakeven_sentence(crossings, 4), _bench_note(fixed) + f" Diffusion: {how}."]
    section = Section("Diffusion break-even: output length N against steps K", [breakeven_figure(points, crossings)],
                      {"median latency per series and N": points, "crossovers": crossings}, notes)
    return section, frame


def cache_section(models: Models, sets: list[PromptSet], s: Settings, lengths: tuple[int, ...] = CACHE_LENGTHS,
                  divisor: int = 4) -> tuple[Section, pd.DataFrame]:
    """Diffusion with each KV cache at N in lengths (K = N/divisor, blocks of CACHE_BLOCK): speed against
    ``none``, token agreement with ``none`` (same prompt, seed and N), perplexity and entropy beside."""
    configs = []
    for n in lengths:
        opts = {"max_new_tokens": n, "steps": n // divisor, "block_length": min(n, s.block_length or CACHE_BLOCK)}
        configs.append(RunConfig("autoregressive", f"autoregressive N={n}", {"max_new_tokens": n}, f"N={n}", n))
        configs += [RunConfig("diffusion", f"diffusion cache={c} N={n}", {**opts, "cache": c}, f"N={n}", n)
                    for c in CACHES]
    fixed = dataclasses.replace(s, ignore_eos=True)
    frame = run_requests(models, sets, configs, fixed, desc="sweep cache")
    table = cache_table(frame)
    notes = [_bench_note(fixed) + f" K = N/{divisor}, blocks of min(N, {s.block_length or CACHE_BLOCK}).",
             "speedup_vs_none = mean latency of cache 'none' / this config's (same prompts, interleaved); agreement = "
             "share of output positions where the token equals the 'none' output of the same request."]
    return Section("Diffusion KV cache: speed, agreement with no cache, quality", [],
                   {"cache sweep": table}, notes), frame


def cache_table(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    keys = ["prompt_set", "x", "prompt_id", "repeat"]
    base = frame[frame["cache"] == "none"].set_index(keys)
    ar = frame[frame["method"] == "autoregressive"].groupby("x")["latency_s"].mean()
    for (n, config), g in frame.groupby(["x", "config"], sort=False):
        none = base.loc[[tuple(k) for k in g[keys].values]]
        agree = [sum(a == b for a, b in zip(t, u, strict=False)) / max(1, len(u))
                 for t, u in zip(g["token_ids"], none["token_ids"], strict=True)]
        row = {"n": n, "config": config, "requests": len(g), "latency_p50_s": g["latency_s"].median(),
               "speedup_vs_none": none["latency_s"].mean() / g["latency_s"].mean(),
               "speedup_vs_ar": ar[n] / g["latency_s"].mean(), "agreement_with_none": float(np.mean(agree)),
               "passes": g["target_forward_passes"].mean(), "fed_per_pass": g["fed_per_pass"].mean()}
        for col in ("perplexity", "token_entropy_bits"):
            if col in g:
                row[col] = g[col].median()
        rows.append(row)
    table = pd.DataFrame(rows)
    table.loc[table["config"].str.startswith("autoregressive"), ["speedup_vs_none", "agreement_with_none"]] = np.nan
    return table


def _context(model: torch.nn.Module | None) -> int:
    return int(getattr(model.config, "max_position_embeddings", None) or 2048) if model is not None else 10**9


def find_crossings(n: list[float], a: list[float], b: list[float]) -> list[tuple[float, float, str]]:
    """Where curve a crosses curve b (interpolated in log N and log latency): (N, latency, who is faster above)."""
    out = []
    d = [math.log(x) - math.log(y) for x, y in zip(a, b, strict=True)]
    for i in range(len(n) - 1):
        if d[i] == 0 or d[i] * d[i + 1] < 0:
            t = d[i] / (d[i] - d[i + 1]) if d[i] != d[i + 1] else 0.0
            log_n = math.log(n[i]) + t * (math.log(n[i + 1]) - math.log(n[i]))
            log_lat = math.log(a[i]) + t * (math.log(a[i + 1]) - math.log(a[i]))
            out.append((math.exp(log_n), math.exp(log_lat), "first" if d[i + 1] < 0 else "second"))
    return out


def find_all_crossings(points: pd.DataFrame) -> pd.DataFrame:
    """Each diffusion series against autoregressive and speculative; no crossing is a row too."""
    series = {name: g.sort_values("n") for name, g in points.groupby("series", sort=False)}
    baselines = [name for name, g in series.items() if g["method"].iloc[0] != "diffusion"]
    rows = []
    for name, g in series.items():
        if g["method"].iloc[0] != "diffusion":
            continue
        for base in baselines:
            merged = g.merge(series[base], on="n", suffixes=("", "_base"))
            n, a, b = list(merged["n"]), list(merged["latency_p50_s"]), list(merged["latency_p50_s_base"])
            hits = find_crossings(n, a, b)
            faster_at_min = name if a[0] < b[0] else base
            if not hits:
                rows.append({"series": name, "against": base, "n_cross": float("nan"), "latency_cross_s": float("nan"),
                             "faster_above": None, "faster_at_smallest_n": faster_at_min,
                             "n_range": f"{n[0]}-{n[-1]}"})
            for n_cross, lat, who in hits:
                rows.append({"series": name, "against": base, "n_cross": n_cross, "latency_cross_s": lat,
                             "faster_above": name if who == "first" else base, "faster_at_smallest_n": faster_at_min,
                             "n_range": f"{n[0]}-{n[-1]}"})
    return pd.DataFrame(rows)


def _breakeven_sentence(crossings: pd.DataFrame, divisor: int) -> str:
    rows = crossings[(crossings["series"] == f"diffusion K=N/{divisor}")
                     & crossings["against"].str.startswith("autoregressive")]
    if rows.empty:
        return f"No diffusion K=N/{divisor} series was measured."
    row = rows.iloc[0]
    if not math.isfinite(row["n_cross"]):
        return (f"Break-even N (diffusion K=N/{divisor} against autoregressive): none in N {row['n_range']}; "
                f"{row['faster_at_smallest_n']} is faster over the whole range.")
    return (f"Break-even N (diffusion K=N/{divisor} against autoregressive): N ≈ {row['n_cross']:.0f}; "
            f"{row['faster_above']} is faster above it.")


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
    """For each B: target B x (gamma+1) vs B x 1, draft B x 1 (interleaved, median); c and the predicted speedup."""
    if models.draft is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no draft model; the batch sweep times target vs draft")
    gen = torch.Generator().manual_seed(0)
    expected_tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1
    rows = []
    for b in tqdm(batches, desc="sweep batch", file=sys.stderr, disable=not progress):
        target, draft = filled_cache(models.target, b, cache_len, gen), filled_cache(models.draft, b, cache_len, gen)
        times = [[pass_seconds(models.target, target, b, 1, gen),
                  pass_seconds(models.target, target, b, gamma + 1, gen),
                  pass_seconds(models.draft, draft, b, 1, gen)] for _ in range(reps + 2)]
        t1, tv, td = np.median(np.array(times[2:]), axis=0)  # the first two rounds warm up
        c, v = td / t1, tv / t1
        rows.append({"batch": b, "cache_len": cache_len, "gamma": gamma, "target_pass_1_s": t1,
                     "target_pass_gamma1_s": tv, "draft_pass_1_s": td, "cost_ratio_c": c, "verify_ratio": v,
                     "alpha": alpha, "predicted_speedup_thm": predicted_speedup(alpha, gamma, c),
                     "predicted_speedup_forward": expected_tokens / (gamma * c + v)})
    return pd.DataFrame(rows)


def batch_section(models: Models, sets: list[PromptSet], s: Settings, acceptance: float | None = None,
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


# ---------------------------------------------------------------------------------------------
# peer comparison: transformers' generate on the same models and prompts

@contextlib.contextmanager
def _assistant_settings(draft: torch.nn.Module, gamma: int):
    """Make transformers draft exactly gamma tokens per step (no schedule, no confidence stop), then restore."""
    config = draft.generation_config
    saved = {k: getattr(config, k, None) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                                                   "assistant_confidence_threshold")}
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def peer_pairs(models: Models, gamma: int) -> list[tuple[str, str, dict, dict]]:
    """(pair, our method, our options, transformers generate kwargs)."""
    pairs = [("greedy", "autoregressive", {}, {})]
    if models.draft is not None:
        pairs.append(("draft model", "speculative", {"drafter": "model", "gamma": gamma},
                      {"assistant_model": models.draft}))
    pairs.append(("prompt lookup", "speculative", {"drafter": "prompt_lookup", "gamma": gamma},
                  {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": DecodeConfig().max_ngram}))
    return pairs


@torch.inference_mode()
def hf_generate(models: Models, prompt_ids: list[int], max_new_tokens: int, kwargs: dict) -> tuple[list[int], float]:
    """transformers' greedy generate (plain, assisted or prompt lookup); new token ids and seconds."""
    ids = torch.tensor([prompt_ids], device=models.device)  # (1, T)
    eos = models.tokenizer.eos_token_id
    pad = models.tokenizer.pad_token_id if models.tokenizer.pad_token_id is not None else eos
    synchronize(models.device)
    start = time.perf_counter()
    out = models.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, **kwargs)
    synchronize(models.device)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start


def _ours(models: Models, method: str, prompt: str, options: dict) -> tuple[Trace, float]:
    synchronize(models.device)
    start = time.perf_counter()
    trace = explorer.decode(method, models, prompt, **options)
    synchronize(models.device)
    return trace, time.perf_counter() - start


def run_peer(models: Models, sets: list[PromptSet], s: Settings) -> pd.DataFrame:
    """Ours and transformers', interleaved per request (order alternating by repeat), greedy, same prompt ids."""
    import transformers

    transformers.logging.set_verbosity_error()  # its notices about generation kwargs would cut the progress bar
    gamma = s.gamma or models.preset.gamma
    pairs = peer_pairs(models, gamma)
    base = {"max_new_tokens": s.max_new_tokens, "temperature": 0.0}
    first = sets[0].prompts[0].text
    first_ids = encode_prompt(models.tokenizer, first, models.preset.chat)[0]
    with _assistant_settings(models.draft, gamma) if models.draft is not None else contextlib.nullcontext():
        for _, method, options, kwargs in pairs:  # warm-up
            for _ in range(max(1, s.warmup)):
                _ours(models, method, first, {**base, **options})
                hf_generate(models, first_ids, s.max_new_tokens, kwargs)
        tasks = [(r, ps, p, pair) for r in range(s.repeats) for ps in sets for p in ps.prompts for pair in pairs]
        rows = []
        for repeat, prompt_set, prompt, (pair, method, options, kwargs) in tqdm(
                tasks, desc="peer", unit="pair", file=sys.stderr, disable=not s.progress, dynamic_ncols=True):
            prompt_ids = encode_prompt(models.tokenizer, prompt.text, models.preset.chat)[0]
            result = {}
            for impl in (["ours", "transformers"] if repeat % 2 == 0 else ["transformers", "ours"]):
                if impl == "ours":
                    trace, seconds = _ours(models, method, prompt.text, {**base, **options})
                    result[impl] = (trace.token_ids, seconds, trace.stats["acceptance_rate"])
                else:
                    result[impl] = (*hf_generate(models, prompt_ids, s.max_new_tokens, kwargs), None)
            for impl, (tokens, seconds, acceptance) in result.items():
                rows.append({"pair": pair, "implementation": impl, "prompt_set": prompt_set.name,
                             "prompt_id": prompt.id, "repeat": repeat, "latency_s": seconds, "new_tokens": len(tokens),
                             "tokens_per_s": len(tokens) / seconds, "acceptance_rate": acceptance,
                             "output_equal": tokens == result["ours"][0]})
    return pd.DataFrame(rows)


def peer_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per pair: total time of ours over theirs (and its inverse, the speed ratio), outputs equal k/n."""
    rows = []
    for pair, g in frame.groupby("pair", sort=False):
        ours, theirs = g[g["implementation"] == "ours"], g[g["implementation"] == "transformers"]
        rows.append({"pair": pair, "requests": len(ours), "ours_p50_s": ours["latency_s"].median(),
                     "transformers_p50_s": theirs["latency_s"].median(),
                     "time_ours_over_theirs": ours["latency_s"].sum() / theirs["latency_s"].sum(),
                     "speed_ratio_theirs_over_ours": theirs["latency_s"].sum() / ours["latency_s"].sum(),
                     "outputs_equal": f"{int(theirs['output_equal'].sum())}/{len(theirs)}",
                     "acceptance_rate_ours": ours["acceptance_rate"].mean()})
    return pd.DataFrame(rows)


def peer_section(models: Models, sets: list[PromptSet], s: Settings) -> tuple[Section, pd.DataFrame]:
    frame = run_peer(models, sets, s)
    gamma = s.gamma or models.preset.gamma
    notes = [f"Greedy (temperature 0), max_new_tokens={s.max_new_tokens}, γ={gamma} on both sides (transformers: "
             "num_assistant_tokens=γ with the constant schedule and no confidence stop; prompt lookup "
             f"prompt_lookup_num_tokens=γ, max_matching_ngram_size={DecodeConfig().max_ngram}). Each request runs "
             "ours and theirs back to back, order alternating by repeat. Our time is the whole explorer.decode call "
             "(tokenizing, every event, the Trace); theirs is generate() on prepared ids.",
             "time_ours_over_theirs < 1 means ours is faster; speed_ratio = theirs / ours."]
    return Section("Peer comparison: transformers' generate", [peer_figure(frame)],
                   {"ours against transformers": peer_summary(frame)}, notes), frame


# ---------------------------------------------------------------------------------------------
# the command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``python -m explorer bench`` (the CLI adds only the subcommand)."""
    add_model_arguments(p)
    p.add_argument("--prompts", default="code",
                   help="shipped set(s) (code, code_edit, prose, multilingual, high_temperature) or file(s), "
                        "comma-separated; a file holds one prompt a line or JSONL {prompt, temperature, id}")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts of each set")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated: {', '.join(METHODS)}")
    p.add_argument("--repeats", type=int, default=1, help="timed requests per prompt and config")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests per config before timing")
    add_option_arguments(p, ["max_new_tokens", "temperature"], defaults=True)
    add_option_arguments(p, ["gamma"])
    p.add_argument("--drafter", default=Settings.drafter, help=option_help("drafter", Settings.drafter))
    add_option_arguments(p, ["steps", "block_length", "cache"])
    add_option_arguments(p, ["seed"], defaults=True)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--ignore-eos", action="store_true", help="decode exactly max_new_tokens (as vLLM's --ignore-eos)")
    p.add_argument("--no-quality", action="store_true", help="skip perplexity and entropy scoring")
    p.add_argument("--sweep", default=None,
                   help=f"comma-separated: {', '.join(SWEEPS)} (runs these instead of the plain bench; "
                        "include 'bench' to run it too)")
    p.add_argument("--peer", action="store_true", help="also compare with transformers' generate (greedy)")
    p.add_argument("--csv", default=None, help="request rows; other parts go to <stem>.<part>.csv")
    p.add_argument("--report", default=None, help="write one self-contained HTML page with every figure")


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(max_new_tokens=args.max_new_tokens, temperature=args.temperature, gamma=args.gamma,
                    drafter=args.drafter, steps=args.steps, block_length=args.block_length, cache=args.cache,
                    seed=args.seed,
                    repeats=args.repeats, warmup=args.warmup, ignore_eos=args.ignore_eos,
                    quality=not args.no_quality, progress=True)


def check_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Validate everything before the (slow) model load; return the methods and the parts to run."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if not methods or bad:
        raise ExplorerError(f"unknown method(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(METHODS)}")
    parts = [w.strip() for w in (args.sweep or "bench").split(",") if w.strip()]
    bad = [w for w in parts if w not in SWEEPS]
    if not parts or bad:
        raise ExplorerError(f"unknown sweep(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(SWEEPS)}")
    if args.repeats < 1 or args.warmup < 0:
        raise ExplorerError("--repeats must be >= 1 and --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        raise ExplorerError("--threads must be >= 1")
    for out in filter(None, [args.csv, args.report]):
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExplorerError(f"cannot write {out}: {exc.strerror}") from None
    s = settings_from_args(args)
    for method in methods:
        options = {k: v for k, v in decode_options(RunConfig(method, method), s, None, 0).items() if v is not None}
        validate(method, DecodeConfig(**options))
    return methods, parts


def check_models(models: Models, methods: list[str], s: Settings) -> None:
    """Fail before the first request when the preset lacks a model the run needs."""
    if "speculative" in methods and s.drafter == "model" and models.draft is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no draft model; use --drafter prompt_lookup or "
                            "early_exit")
    if "diffusion" in methods and models.diffusion is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no diffusion model; drop it from --methods")


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def machine_header(models: Models, sets: list[PromptSet], s: Settings, parts: list[str],
                   load_at_start: str = "n/a") -> dict[str, str]:
    weights = models.memory_bytes()
    return {
        "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}, "
                   f"{platform.system()} {platform.release()}",
        "load average (1, 5, 15 min)": f"at start {load_at_start}; at end {load_average()} (other work on the "
                                        "machine inflates and spreads the latencies)",
        "device": str(models.device) + (f" ({torch.cuda.get_device_name(models.device)})"
                                        if models.device.type == "cuda" else ""),
        "dtype": str(models.dtype).replace("torch.", ""),
        "batch size": "1 (one request at a time)" + ("; the batch sweep times B = " + ", ".join(map(str, BATCHES))
                                                     if "batch" in parts else ""),
        "preset": models.preset.name,
        "models": "; ".join(f"{k}: {v} ({weights.get(k, 0) / 2**20:.1f} MiB)" for k, v in models.names.items()),
        "prompt sets": "; ".join(f"{ps.name} ({len(ps.prompts)} prompts, {ps.source})" for ps in sets),
        "parts": ", ".join(parts),
        "settings": _bench_note(s),
        "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
                    f"python {platform.python_version()}",
        "command": " ".join(["python -m explorer"] + sys.argv[1:]) if sys.argv and "explorer" in sys.argv[0] else "",
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def run(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand: run the parts, print their tables, write CSV and the report."""
    methods, parts = check_args(args)
    sets = load_prompt_sets(args.prompts, args.limit)
    for ps in sets:
        if ps.notice:
            print(f"notice: {ps.notice}", file=sys.stderr)
    s = settings_from_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_at_start = load_average()
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype)
    check_models(models, methods if "bench" in parts else [], s)
    sections, frames, acceptance = [], {}, None
    for part in parts:
        if part == "bench":
            section, frame = bench_section(models, sets, methods, s)
            spec = frame[(frame["method"] == "speculative") & (frame["drafter"] == "model")]
            if len(spec) and spec["proposed"].sum():
                acceptance = spec["accepted"].sum() / spec["proposed"].sum()
        elif part in ("gamma", "temperature", "drafter", "drafter_gamma"):
            section, frame = sweep_section(part, models, sets, s)
        elif part == "diffusion":
            section, frame = diffusion_section(models, sets, s)
        elif part == "cache":
            section, frame = cache_section(models, sets, s)
        elif part == "batch":
            section, frame = batch_section(models, sets, s, acceptance)
        else:
            section, frame = memory_section(models)
        _print_section(section)
        sections.append(section)
        frames[part] = frame
    if args.peer:
        section, frames["peer"] = peer_section(models, sets, s)
        _print_section(section)
        sections.append(section)
    try:
        written = write_csvs(args.csv, frames) if args.csv else []
        if args.report:
            header = machine_header(models, sets, s, parts + ["peer"] * args.peer, load_at_start)
            written.append(write_report(args.report, header, sections))
    except OSError as exc:
        raise ExplorerError(f"cannot write the results: {exc}") from None
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(f"load average at start {load_at_start}, at end {load_average()}", file=sys.stderr)
    return 0


def _print_section(section: Section) -> None:
    print(f"\n== {section.title}")
    for name, table in section.tables.items():
        print(f"-- {name}")
        print(format_summary(table) if {"prompt_set", "config", "requests"} <= set(table) else
              table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for note in section.notes:
        print(f"note: {note}")


def write_csvs(path: str, frames: dict[str, pd.DataFrame]) -> list[Path]:
    """The first part's rows to ``path``; every other part's to ``<stem>.<part>.csv`` beside it."""
    path, written = Path(path), []
    for i, (part, frame) in enumerate(frames.items()):
        target = path if i == 0 else path.with_name(f"{path.stem}.{part}{path.suffix or '.csv'}")
        frame.drop(columns=["itl_s", "token_ids"], errors="ignore").to_csv(target, index=False)
        written.append(target)
    return written
