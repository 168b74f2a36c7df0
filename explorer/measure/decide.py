"""``explorer decide``: the seeds' checklist answered from the user's own traffic, ending in a verdict per group.

The checklist (second seed): measure acceptance on your own traffic, report the tail rather than the mean, state
the batch size, account for the draft model's memory, re-measure after every target swap; and (first seed)
diffusion pays only where K is well below N at the quality you need. Each part below answers one item from
requests decoded here (``bench.run_requests``: one request at a time, AR and speculative interleaved per prompt)
or from a live engine; every interval is ``metrics``' bootstrap, every percentile ``metrics.percentile``.

Verdict rule, per group (category x temperature): "enable" when the speedup's 95% interval lies above 1,
"do not enable" when it lies below 1, otherwise "no clear gain" (the data cannot tell).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from explorer.decoding.api import encode_prompt
from explorer.decoding.config import applies
from explorer.decoding.unmasking import RULE_DEFAULTS, SAMPLERS
from explorer.errors import ExplorerError
from explorer.measure.bench import BenchSettings, RunConfig, fit_alpha, preset_chain, run_requests
from explorer.measure.costs import batch_costs, measured_kv_bytes
from explorer.measure.metrics import PERCENTILES, percentile, percentile_ci, ratio_ci
from explorer.measure.workload import PromptSet
from explorer.precision import EXACT
from explorer.runtime import Models

CODE = re.compile(r"```|\bdef |\bclass |\bfunction\b|\breturn\b|[{};]\s*$|\b(python|javascript|typescript|java|rust|"
                  r"c\+\+|sql|bash|code|script|regex)\b", re.IGNORECASE | re.MULTILINE)
NON_ENGLISH = re.compile(r"\b(le|la|les|des|est|une|el|los|las|por|para|der|die|das|und|ist|nicht|explique|"
                         r"explica|erkläre|warum|pourquoi|porque|qué|wie)\b", re.IGNORECASE)
LONG_CONTEXT_TOKENS = 512
SPEC, AR = "speculative", "autoregressive"
MIN_REQUESTS = 3  # per group, before a verdict


@dataclass(frozen=True)
class DecideSettings:
    max_new_tokens: int = 64
    temperatures: tuple[float, ...] = (0.0,)
    gamma: int | None = None  # None: the preset's
    drafter: str | None = None  # None: the preset's
    repeats: int = 1
    seed: int = 0
    diffusion_divisors: tuple[int, ...] = (1, 2, 4)  # K = N / d
    threshold: float = 0.9
    diffusion_prompts: int = 6  # the diffusion part decodes the first prompts of each group, not all
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    long_context_tokens: int = LONG_CONTEXT_TOKENS
    progress: bool = True


def categorize(text: str, prompt_tokens: int, long_tokens: int = LONG_CONTEXT_TOKENS) -> str:
    """The automatic group of an unlabelled prompt: long context, non-English, code, else prose."""
    if prompt_tokens > long_tokens:
        return "long context"
    letters = [c for c in text if c.isalpha()]
    if (letters and sum(not c.isascii() for c in letters) / len(letters) > 0.15) or len(NON_ENGLISH.findall(text)) >= 2:
        return "non-English"
    return "code" if CODE.search(text) else "prose"


def categories(models: Models, sets: list[PromptSet], s: DecideSettings) -> tuple[dict[str, str], dict[str, int]]:
    """prompt id -> group (the file's ``category`` where given, else ``categorize``), and -> prompt tokens."""
    groups, tokens = {}, {}
    for ps in sets:
        for p in ps.prompts:
            tokens[p.id] = len(encode_prompt(models.tokenizer, p.text, models.preset.chat)[0])
            groups[p.id] = p.category or categorize(p.text, tokens[p.id], s.long_context_tokens)
    return groups, tokens


def bench_settings(models: Models, s: DecideSettings, temperature: float) -> BenchSettings:
    return BenchSettings(max_new_tokens=s.max_new_tokens, temperature=temperature,
                         gamma=s.gamma or models.preset.gamma, drafter=s.drafter or models.preset.drafter,
                         seed=s.seed, repeats=s.repeats, quality=False, progress=s.progress)


def run_traffic(models: Models, sets: list[PromptSet], s: DecideSettings, label: str = "") -> pd.DataFrame:
    """AR and speculative on every prompt at every temperature, interleaved per prompt; one row per request with
    its group. A prompt's own temperature (JSONL) overrides the run's, as in the bench."""
    groups, tokens = categories(models, sets, s)
    frames = []
    for t in s.temperatures:
        b = bench_settings(models, s, t)
        gamma, cut, label = preset_chain(models, s.gamma, b.drafter)
        configs = [RunConfig(AR, AR), RunConfig(SPEC, label, {"gamma": gamma, "draft_confidence": cut})]
        frames.append(run_requests(models, sets, configs, b, desc=f"T = {t:g}, autoregressive and {label}"))
    frame = pd.concat(frames, ignore_index=True)
    frame["category"] = frame["prompt_id"].map(groups)
    frame["prompt_tokens"] = frame["prompt_id"].map(tokens)
    frame["seconds_per_token"] = frame["latency_s"] / frame["new_tokens"].clip(lower=1)
    return frame


# ---------------------------------------------------------------------------------------------
# 1 and 7: acceptance, tokens per pass and speedup per group, and the verdict

def verdict(group: str, speedup: tuple[float, float, float], tail: str = "", n: int = MIN_REQUESTS) -> dict[str, str]:
    """"enable" when the speedup's interval lies above 1, "do not enable" below 1, else "no clear gain"; fewer
    than ``MIN_REQUESTS`` requests decide nothing (a bootstrap of one request is no interval)."""
    x, lo, hi = speedup
    numbers = f"{x:.2f}x [{lo:.2f}, {hi:.2f}]"
    if not all(map(math.isfinite, speedup)):
        return {"group": group, "verdict": "no data", "line": f"{group}: not measured"}
    if n < MIN_REQUESTS:
        kind, line = "too few requests", f"too few requests for {group} ({n}; at least {MIN_REQUESTS}): {x:.2f}x"
    elif lo > 1:
        kind, line = "enable", f"enable for {group}: {numbers}"
    elif hi < 1:
        kind, line = "do not enable", f"do not enable for {group}: {numbers}"
    else:
        kind, line = "no clear gain", f"no clear gain for {group}: {numbers} (the interval spans 1)"
    return {"group": group, "verdict": kind, "line": line + (f"; {tail}" if tail else "")}


def group_rows(frame: pd.DataFrame) -> list[dict[str, object]]:
    """One row per (category, temperature) and one for all traffic: requests, acceptance, tokens per target pass
    and speedup (AR seconds per token over speculative's), each with its bootstrap interval."""
    rows = []
    keyed = [(c, t, g) for (c, t), g in frame.groupby(["category", "temperature"], sort=True)]
    for category, temperature, g in keyed + [("all traffic (pooled)", None, frame)]:
        ar, sp = g[g["method"] == AR], g[g["method"] == SPEC]
        name = category if temperature is None else f"{category} at T = {temperature:g}"
        acc = ratio_ci(sp["accepted"], sp["proposed"])
        tpp = ratio_ci(sp["new_tokens"], sp["target_forward_passes"])
        speed = ratio_ci(ar["seconds_per_token"], sp["seconds_per_token"])
        p99 = tail_flag(ar["latency_s"], sp["latency_s"])
        rows.append({"group": name, "category": category, "temperature": temperature, "requests": int(len(sp)),
                     "acceptance": acc[0], "acceptance_lo": acc[1], "acceptance_hi": acc[2],
                     "tokens_per_pass": tpp[0], "tokens_per_pass_lo": tpp[1], "tokens_per_pass_hi": tpp[2],
                     "speedup": speed[0], "speedup_lo": speed[1], "speedup_hi": speed[2],
                     "run_ids": " ".join(sorted({f"{r.prompt_id}#{r.repeat}" for r in sp.itertuples()}))[:400],
                     **verdict(name, speed, p99, n=len(sp))})
    return rows


# ---------------------------------------------------------------------------------------------
# 2: the tail

def tail_flag(ar_latency, spec_latency) -> str:
    """Says so where the mean improves and p99 does not."""
    ar_latency, spec_latency = list(ar_latency), list(spec_latency)
    if not ar_latency or not spec_latency:
        return ""
    if np.mean(spec_latency) < np.mean(ar_latency) and percentile(spec_latency, 99) >= percentile(ar_latency, 99):
        return "the mean latency improves but p99 does not"
    return ""


def tail_rows(frame: pd.DataFrame) -> list[dict[str, object]]:
    """p50/p95/p99 of request latency and inter-token latency per method and group, with intervals."""
    rows = []
    for (category, method), g in list(frame.groupby(["category", "method"])) + \
            [(("all traffic", m), frame[frame["method"] == m]) for m in (AR, SPEC)]:
        itl = [x for gaps in g["itl_s"] for x in gaps]
        for metric, values in (("request latency", list(g["latency_s"])), ("inter-token latency", itl)):
            row = {"group": category, "method": method, "metric": metric, "n": len(values),
                   "mean_ms": float(np.mean(values)) * 1000 if values else math.nan}
            for q in PERCENTILES:
                x, lo, hi = percentile_ci(values, q)
                row.update({f"p{q}_ms": x * 1000, f"p{q}_lo_ms": lo * 1000, f"p{q}_hi_ms": hi * 1000})
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# 3: batch size (an engine's measurement, else the explorer's prediction)

def crossing(batches: list[float], gains: list[float]) -> float | None:
    """The first batch at which the gain falls to 1 or below (linear between measured points); None if never."""
    for i, (b, g) in enumerate(zip(batches, gains, strict=True)):
        if g <= 1:
            if i == 0:
                return float(b)
            b0, g0 = batches[i - 1], gains[i - 1]
            return float(b0 + (g0 - 1) * (b - b0) / (g0 - g))
    return None


def batch_sentence(batch: dict[str, object]) -> str:
    """One line: where the gain crosses 1, or that it never was above 1, or never falls to it; a prediction from
    timed passes that spread too widely ends with its noise flag."""
    rows, where = batch["rows"], batch["crosses_1_at_batch"]
    first = rows[0].get("predicted_speedup_forward", rows[0].get("speedup_throughput")) if rows else None
    noisy = next((f" ({r['noisy']})" for r in rows if r.get("noisy")), "")
    label = f"batch ({batch['source']})"
    if where is None:
        return f"{label}: the gain stays above 1 at every batch measured{noisy}"
    if first is not None and float(first) <= 1:
        return f"{label}: no gain at any batch (already {float(first):.2f}x at batch 1){noisy}"
    return f"{label}: the gain crosses 1 at batch {where:.1f}{noisy}"


def predicted_batch(models: Models, s: DecideSettings, acceptance: float) -> dict[str, object]:
    if models.precision in EXACT:  # their kernels take one sequence a pass
        raise ExplorerError(f"the exact {models.precision} kernels run batch 1 only, so batch effects cannot be timed "
                            f"on them: run the checklist on {models.preset.name}@float32, or measure an engine "
                            "(explorer decide --engine URL)")
    gamma = s.gamma or models.preset.gamma
    frame = batch_costs(models, gamma, fit_alpha(acceptance, gamma), s.batches, reps=5, progress=s.progress)
    gains = list(frame["predicted_speedup_forward"])
    return {"source": "predicted", "how": "timed target and draft passes at each batch, with the measured acceptance "
            "(a model drafter's cost; the decoders here run batch 1)", "rows": frame.to_dict("records"),
            "crosses_1_at_batch": crossing(list(frame["batch"]), gains)}


def measured_batch(engine: str, compare: str, sets: list[PromptSet], s: DecideSettings) -> dict[str, object]:
    from explorer.engine.traffic import (  # deferred: openai (~1 s) via explorer.engine.traffic
        resolve_targets,
        run_bench,
        summary_rows,
    )

    targets = resolve_targets([("speculative", engine), ("baseline", compare)])
    prompts = [p for ps in sets for p in ps.prompts]
    bench = run_bench(targets, prompts, s.concurrency, max_tokens=s.max_new_tokens, temperature=s.temperatures[0])
    rows = [r for r in summary_rows(bench, baseline="baseline") if r["label"] == "speculative"]
    gains = [float(r.get("speedup_throughput", math.nan)) for r in rows]
    return {"source": "measured", "how": f"engine {engine} (speculation on) against {compare} (off), "
            "concurrency sweep", "rows": rows, "error": bench.error,
            "crosses_1_at_batch": crossing([r["concurrency"] for r in rows], gains)}


# ---------------------------------------------------------------------------------------------
# 4: the drafter's memory, measured at the traffic's context lengths

def memory_rows(models: Models, frame: pd.DataFrame, drafter: str) -> list[dict[str, object]]:
    lengths = frame["prompt_tokens"] + frame["new_tokens"]
    weights = models.memory_bytes()
    rows = []
    for name, n in (("median request", int(np.median(lengths))), ("longest request", int(lengths.max()))):
        target_kv = measured_kv_bytes(models.target, n)
        if drafter == "model" and models.draft is not None:
            draft_w, draft_kv, how = weights.get("draft", 0), measured_kv_bytes(models.draft, n), "its own cache"
        elif drafter == "assistant" and models.assistant is not None:
            layers = models.target.config.num_hidden_layers
            draft_w, draft_kv = weights.get("assistant", 0), target_kv // layers
            how = "one decoder layer of the target's shape (the target's measured cache / its layers)"
        else:
            draft_w, draft_kv, how = 0, 0, "none (the drafter reads the prompt or the target itself)"
        rows.append({"context": name, "tokens": n, "drafter": drafter, "drafter_weights_bytes": draft_w,
                     "drafter_kv_bytes": draft_kv, "target_weights_bytes": weights["target"],
                     "target_kv_bytes": target_kv, "drafter_share": (draft_w + draft_kv) /
                     max(1, draft_w + draft_kv + weights["target"] + target_kv), "how": how})
    return rows


# ---------------------------------------------------------------------------------------------
# 5: after a swap, and 6: diffusion

def swap_rows(before: list[dict[str, object]], after: list[dict[str, object]], label: str) -> list[dict[str, object]]:
    """How acceptance and speedup moved per group when the target changed."""
    old = {r["group"]: r for r in before}
    rows = []
    for r in after:
        b = old.get(r["group"])
        if b is None:
            continue
        rows.append({"group": r["group"], "swap": label, "acceptance_before": b["acceptance"],
                     "acceptance_after": r["acceptance"], "acceptance_change": r["acceptance"] - b["acceptance"],
                     "speedup_before": b["speedup"], "speedup_after": r["speedup"],
                     "speedup_after_lo": r["speedup_lo"], "speedup_after_hi": r["speedup_hi"],
                     "verdict_after": r["verdict"]})
    return rows


QUALITY_RULE = ("median perplexity under the target within 2x of autoregressive's, and adjacent repeated words "
                "at most autoregressive's plus one in a hundred words, on the same prompts")


def quality_holds(perplexity: float, ar_perplexity: float, repeats: float, ar_repeats: float) -> bool:
    """QUALITY_RULE: a diffusion setting's text against the target's own on the same prompts."""
    return bool(perplexity <= 2 * ar_perplexity and repeats <= ar_repeats + 0.01)


def sampler_configs(n: int, block: int, threshold: float) -> list[RunConfig]:
    """One diffusion config per registered sampler (decoding/unmasking.RULES) at its own defaults, with the
    confidence ``threshold`` where the sampler reads one (config.applies): the quality-speed frontier."""
    configs = []
    for name in SAMPLERS:
        options = {"steps": n, "block_length": block, "sampler": name}
        if applies("threshold", "diffusion", options):
            options["threshold"] = threshold
        values = {**RULE_DEFAULTS, **options}
        shown = ", ".join(f"{k.replace('_', ' ')} {values[k]:g}" for k in ("threshold", *RULE_DEFAULTS)
                          if k in values and applies(k, "diffusion", values))
        configs.append(RunConfig("diffusion", f"{name}, {shown}" if shown else name, options, x=0))
    return configs


def lane_default_config(models: Models, n: int, block: int) -> list[RunConfig]:
    """The app's diffusion lane as the preset starts it (its threshold, no word twice in a row and no repeated
    n-gram where it bans those), where that is not one of the sampler rows already."""
    p = models.preset
    if not p.diffusion_threshold and not p.diffusion_no_adjacent_repeat and not p.diffusion_no_repeat_ngram \
            and not p.diffusion_cache:
        return []
    options = {"steps": n, "block_length": block, "sampler": p.diffusion_sampler,
               "threshold": p.diffusion_threshold or None, "no_adjacent_repeat": p.diffusion_no_adjacent_repeat}
    options.update({"no_repeat_ngram": p.diffusion_no_repeat_ngram} if p.diffusion_no_repeat_ngram else {})
    options.update({"cache": p.diffusion_cache} if p.diffusion_cache else {})
    shown = [f"threshold {p.diffusion_threshold:g}"] if p.diffusion_threshold else []
    shown += ["no word twice in a row"] if p.diffusion_no_adjacent_repeat else []
    shown += [f"no {p.diffusion_no_repeat_ngram}-token phrase twice"] if p.diffusion_no_repeat_ngram else []
    shown += [f"the {p.diffusion_cache} cache"] if p.diffusion_cache else []
    return [RunConfig("diffusion", f"the lane's default: {p.diffusion_sampler}, {', '.join(shown)}", options, x=0)]


def diffusion_rows(models: Models, sets: list[PromptSet], s: DecideSettings, groups: dict[str, str]
                   ) -> list[dict[str, object]]:
    """N = max_new_tokens; K = N/d for each divisor, every sampler at its defaults (Fast-dLLM's threshold for
    those that read one) and the app's lane as the preset starts it, on the first prompts of each group: tokens
    per pass against quality (perplexity under the target, distinct 3-grams, repeated words) beside AR's on the
    same prompts, and time."""
    if models.diffusion is None:
        return []
    n = s.max_new_tokens
    chosen, seen = [], {}
    for ps in sets:
        for p in ps.prompts:
            if seen.get(groups[p.id], 0) < s.diffusion_prompts:
                seen[groups[p.id]] = seen.get(groups[p.id], 0) + 1
                chosen.append(p)
    subset = [PromptSet("diffusion subset", "decide", tuple(chosen))]
    block = min(n, 8) if n % 8 == 0 else n
    configs = [RunConfig(AR, AR)]
    for d in s.diffusion_divisors:
        if n % d == 0 and (n // d) % (n // block) == 0:
            configs.append(RunConfig("diffusion", f"K={n // d}", {"steps": n // d, "block_length": block}, x=n // d))
    configs += sampler_configs(n, block, s.threshold)
    configs += lane_default_config(models, n, block)
    b = replace(bench_settings(models, s, s.temperatures[0]), quality=True)
    frame = run_requests(models, subset, configs, b, desc="diffusion quality")
    frame["seconds_per_token"] = frame["latency_s"] / frame["new_tokens"].clip(lower=1)
    ar = frame[frame["method"] == AR]
    ar_ppl = float(np.median(ar["perplexity"]))
    ar_repeats, ar_distinct = float(np.nanmean(ar["repeat_rate"])), float(np.nanmean(ar["distinct_3"]))
    rows = []
    for label, g in frame[frame["method"] == "diffusion"].groupby("config", sort=False):
        ppl = float(np.median(g["perplexity"]))
        speed = ratio_ci(ar["seconds_per_token"], g["seconds_per_token"])
        repeats = float(np.nanmean(g["repeat_rate"]))
        holds = quality_holds(ppl, ar_ppl, repeats, ar_repeats)
        rows.append({"config": label, "N": n, "passes_per_request": float(g["target_forward_passes"].mean()),
                     "tokens_per_pass": float(g["new_tokens"].sum() / g["target_forward_passes"].clip(lower=1).sum()),
                     "distinct_3": float(np.nanmean(g["distinct_3"])), "ar_distinct_3": ar_distinct,
                     "median_perplexity": ppl, "ar_median_perplexity": ar_ppl, "quality_holds": holds,
                     "repeat_rate": repeats, "ar_repeat_rate": ar_repeats,
                     "speedup_vs_ar": speed[0], "speedup_lo": speed[1], "speedup_hi": speed[2],
                     "beats_ar": bool(holds and speed[1] > 1), "requests": int(len(g))})
    return rows
