"""The plain bench and the sweeps (gamma, temperature, drafter, diffusion length, cache): each runs its
requests through ``bench.run_requests`` and returns a report section and its rows."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from explorer.decoding.config import CACHES, SWEEP_CACHE
from explorer.decoding.diffusion import resolve_cache
from explorer.decoding.drafters import available_drafters
from explorer.measure.bench import (
    CACHE_BLOCK,
    CACHE_LENGTHS,
    DRAFT_GAMMAS,
    GAMMAS,
    K_DIVISORS,
    LENGTHS,
    TEMPERATURES,
    BenchSettings,
    RunConfig,
    plain_configs,
    run_requests,
    summarize_requests,
)
from explorer.measure.metrics import (
    percentile,
)
from explorer.measure.report import (
    Section,
    breakeven_figure,
    speed_quality_figure,
    sweep_figure,
    tail_latency_figure,
    throughput_figure,
)
from explorer.measure.workload import QUALITY_COLUMNS, PromptSet
from explorer.runtime import Models

# ---------------------------------------------------------------------------------------------
# the plain bench and the sweeps (each returns a report section and its rows)

def bench_section(models: Models, sets: list[PromptSet], methods: list[str],
                  s: BenchSettings) -> tuple[Section, pd.DataFrame]:
    frame = run_requests(models, sets, plain_configs(methods, s, models), s)
    table = summarize_requests(frame)
    figures = [tail_latency_figure(frame), throughput_figure(table)]
    if s.quality:
        figures.append(speed_quality_figure(table))
    section = Section("Requests: latency, TTFT, inter-token latency, acceptance, quality", figures,
                      {"summary per prompt set and config": table.drop(columns=["group", "x"])},
                      [bench_note(s), "ITL percentiles pool every gap between consecutive tokens of every request; "
                       "a speculative step emits a burst, so many gaps are ~0 and the tail holds the verify steps."])
    return section, frame


def bench_note(s: BenchSettings) -> str:
    eos = "EOS ignored: every request makes exactly max_new_tokens" if s.ignore_eos else "requests stop at EOS"
    return (f"max_new_tokens={s.max_new_tokens}, temperature={s.temperature} (a prompt's own temperature wins), "
            f"repeats={s.repeats} (seed + repeat), warm-up={s.warmup} per config, {eos}; one request at a time.")


def sweep_section(kind: str, models: Models, sets: list[PromptSet], s: BenchSettings,
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
    notes = [bench_note(s), "Measured speedup is a tokens/s ratio; both predictions use this run's measured "
             "acceptance and forward times (see the module docstring of explorer/measure/bench.py)."]
    return Section(f"Sweep: {kind}", [fig], {f"{kind} sweep": table[[c for c in cols if c in table]]}, notes), frame


def diffusion_section(models: Models, sets: list[PromptSet], s: BenchSettings, lengths: tuple[int, ...] = LENGTHS,
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
    notes = [_breakeven_sentence(crossings, 4), bench_note(fixed) + f" Diffusion: {how}."]
    section = Section("Diffusion break-even: output length N against steps K", [breakeven_figure(points, crossings)],
                      {"median latency per series and N": points, "crossovers": crossings}, notes)
    return section, frame


def cache_section(models: Models, sets: list[PromptSet], s: BenchSettings, lengths: tuple[int, ...] = CACHE_LENGTHS,
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
    notes = [bench_note(fixed) + f" K = N/{divisor}, blocks of min(N, {s.block_length or CACHE_BLOCK}).",
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
        for col in QUALITY_COLUMNS:
            if col in g:
                row[col] = g[col].median()
        rows.append(row)
    table = pd.DataFrame(rows)
    table.loc[table["config"].str.startswith("autoregressive"), ["speedup_vs_none", "agreement_with_none"]] = np.nan
    return table


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
