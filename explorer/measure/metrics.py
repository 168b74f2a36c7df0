"""Traces -> pandas DataFrames -> the numbers a deployment decision needs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from explorer.decoding.config import setup_label
from explorer.decoding.events import Proposal, Trace, Verification

PERCENTILES = (50, 95, 99)


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no data."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def inter_token_latencies(trace: Trace) -> list[float]:
    """Gaps between consecutive tokens becoming final (bursts give zeros; that is the point)."""
    t = trace.token_times
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def request_row(trace: Trace, **extra: object) -> dict[str, object]:
    """One row per request: the prompt, every setting, latency, TTFT, ITL p50/p99 within the request,
    acceptance, passes."""
    s = trace.stats
    itl = inter_token_latencies(trace)
    settings = {k: v for k, v in trace.config.items() if k not in ("method", "preset") and _scalar(v)}
    return {
        "batch": s.get("batch"),  # "run 3" (the page's Run) or "measure 2" (a Measure batch); None elsewhere
        "prompt": trace.prompt,
        "method": trace.method,
        "preset": s["preset"],
        "drafter": s.get("drafter"),
        "gamma": s.get("gamma"),
        "steps": s.get("steps"),
        "temperature": trace.config.get("temperature"),
        "precision": s.get("precision") or s.get("dtype"),
        "setup": setup_label(trace.method, trace.config, s.get("precision") or s.get("dtype")),
        "new_tokens": s["new_tokens"],
        "latency_s": s["wall_s"],
        "ttft_s": s["ttft_s"],
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
        "acceptance_rate": s["acceptance_rate"],
        "tokens_per_target_pass": s["tokens_per_target_pass"],
        "target_forward_passes": s["target_forward_passes"],
        "draft_forward_passes": s["draft_forward_passes"],
        "tokens_per_s": s["tokens_per_s"],
        "device": s["device"],
        "dtype": s["dtype"],
        "batch_size": s["batch_size"],
        **{k: v for k, v in settings.items() if k not in ("drafter", "gamma", "steps", "temperature", "precision")},
        "text": trace.text,
        **extra,
    }


def _scalar(v: object) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def requests_frame(traces: Iterable[Trace]) -> pd.DataFrame:
    """One row per request; a column whose values are all integers (or missing) stays integer (γ 2, not 2.0,
    also in the CSV), missing values empty."""
    rows = [request_row(t) for t in traces]
    frame = pd.DataFrame(rows)
    for col in frame.columns:
        values = [r.get(col) for r in rows if r.get(col) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            frame[col] = frame[col].astype("Int64")
    return frame


def summarize(frame: pd.DataFrame, by: str | list[str] = "method") -> pd.DataFrame:
    """p50/p95/p99 of request latency, TTFT and ITL per group, mean acceptance, tokens/s."""
    rows = []
    for key, group in frame.groupby(by, sort=False, dropna=False):
        row = dict(zip([by] if isinstance(by, str) else by, key if isinstance(key, tuple) else (key,), strict=True))
        row["requests"] = len(group)
        for col in ("latency_s", "ttft_s", "itl_p50_s"):
            for q in PERCENTILES:
                row[f"{col.removesuffix('_s')}_p{q}_s"] = percentile(group[col], q)
        acc = group["acceptance_rate"].dropna()
        row["acceptance_rate_mean"] = float(acc.mean()) if len(acc) else float("nan")
        row["tokens_per_target_pass"] = float(group["new_tokens"].sum() / group["target_forward_passes"].sum())
        row["tokens_per_s"] = float(group["new_tokens"].sum() / group["latency_s"].sum())
        rows.append(row)
    return pd.DataFrame(rows)


def verification_frame(trace: Trace) -> pd.DataFrame:
    """One row per verify step: proposed, accepted, emitted, running acceptance rate."""
    rows, proposed, accepted, drafted = [], 0, 0, 0
    for e in trace.events:
        if isinstance(e, Proposal):
            drafted = len(e.tokens)
        elif isinstance(e, Verification):
            proposed, accepted = proposed + drafted, accepted + e.accepted
            rows.append({"step": e.step, "proposed": drafted, "accepted": e.accepted, "emitted": len(e.emitted),
                         "running_acceptance": accepted / proposed if proposed else float("nan")})
            drafted = 0
    return pd.DataFrame(rows)


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023, Thm 3.8: (1 - a^(g+1)) / ((1 - a)(g c + 1))."""
    if alpha >= 1.0:
        return (gamma + 1) / (gamma * cost_ratio + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * cost_ratio + 1))


NOISY_SPREAD = 0.25  # (p90 - p10) / median of repeated timed passes above this: the prediction is flagged


def pass_spread(seconds: Sequence[float]) -> float:
    """(p90 - p10) / median of repeated timings of one forward pass; NaN under 3 timings."""
    x = np.asarray([s for s in seconds if np.isfinite(s)], dtype=float)
    if len(x) < 3 or np.median(x) <= 0:
        return float("nan")
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return float((p90 - p10) / p50)


def noise_flag(*series: Sequence[float], limit: float = NOISY_SPREAD) -> str:
    """"" when every series of timed passes a prediction divides is tight, else the one sentence that flags it.

    On an idle machine one forward pass repeats within a few percent (p10-p90 under ~10% of the median), so a
    cost ratio of medians is good to a few percent. When another process takes the cores, passes stretch
    unevenly: a spread over 25% means the ratio (and the gain predicted from it) can be off by a quarter, enough
    to move a predicted 1.2x across break-even, so the number must not stand unlabelled."""
    spreads = [s for s in (pass_spread(x) for x in series) if np.isfinite(s)]
    worst = max(spreads, default=float("nan"))
    if not np.isfinite(worst) or worst <= limit:
        return ""
    return f"noisy: the timed passes spread by {worst:.0%} (machine busy?)"


# ----------------------------------------------------------------------------------------------
# honest summaries: grouped by setup (never pooled across it), a spread beside every number

# a group is one setup (decoding/config.setup_label: every option that changes the output distribution or the cost,
# and the precision), never pooled across; these columns, equal within a setup, are kept beside it
GROUP_KEYS = ("preset", "method", "setup")
SETUP_COLUMNS = ("drafter", "gamma", "temperature", "steps", "block_length", "precision")
FEW_SAMPLES = 5  # below this a spread is shown but flagged
BOOTSTRAP_RESAMPLES = 2000


def bootstrap_ci(values: Iterable[float], stat=np.median, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``stat`` (a function of a 1-D array; vectorised over axis 1
    when it accepts ``axis``); (nan, nan) for no data. Seeded, so a table is reproducible."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if not arr.size:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    samples = arr[rng.integers(0, arr.size, size=(resamples, arr.size))]
    stats = stat(samples, axis=1)
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def percentile_ci(values: Iterable[float], q: float, **kwargs) -> tuple[float, float, float]:
    """(percentile, CI low, CI high)."""
    values = list(values)
    lo, hi = bootstrap_ci(values, lambda a, axis: np.percentile(a, q, axis=axis), **kwargs)
    return percentile(values, q), lo, hi


def ratio_ci(numerator: Iterable[float], denominator: Iterable[float], resamples: int = BOOTSTRAP_RESAMPLES,
             seed: int = 0) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) and a bootstrap CI, resampling each side independently
    (e.g. the AR lane's seconds per token over a method's: a speedup)."""
    a = np.asarray([v for v in numerator if v is not None and np.isfinite(v)], dtype=float)
    b = np.asarray([v for v in denominator if v is not None and np.isfinite(v)], dtype=float)
    if not a.size or not b.size or b.mean() <= 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
    rb = b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1)
    ratios = ra / np.where(rb > 0, rb, np.nan)
    lo, hi = np.nanquantile(ratios, [0.025, 0.975])
    return float(a.mean() / b.mean()), float(lo), float(hi)


def _group_label(key: tuple, keys: Sequence[str]) -> dict[str, object]:
    return {k: (None if v is pd.NA or isinstance(v, float) and np.isnan(v) else v)
            for k, v in zip(keys, key, strict=True)}


def _reference_key(row: dict[str, object]) -> tuple:
    """The AR group a row is compared with: same preset and temperature."""
    return (row["preset"], row["temperature"])


def _seconds_per_token(group: pd.DataFrame) -> pd.Series:
    return group["latency_s"] / group["new_tokens"].clip(lower=1)


def grouped_summary(frame: pd.DataFrame, other_family: Iterable[str] = (), by_prompt: bool = False) -> pd.DataFrame:
    """One row per setup (GROUP_KEYS; with ``by_prompt`` also per prompt): n, a warning under FEW_SAMPLES,
    latency p50/p95/p99 and TTFT p50 each with a 95% bootstrap CI, mean acceptance with its CI, and the
    speedup over the autoregressive rows of the same preset and temperature (and prompt) with its CI.
    ``other_family``: presets whose diffusion model is of another family (another tokenizer): its tokens
    are not the target's, so it gets no speedup, and the row says why."""
    if frame.empty:
        return pd.DataFrame()
    keys = [k for k in GROUP_KEYS if k in frame.columns] + (["prompt"] if by_prompt else [])
    frame = frame.copy()
    frame["_spt"] = _seconds_per_token(frame)
    ar = frame[frame["method"] == "autoregressive"]
    # the reference: autoregressive rows of the same preset, temperature and precision (never a ratio across them)
    ar_keys = [k for k in ("preset", "temperature", "precision") if k in frame.columns] + \
        (["prompt"] if by_prompt else [])
    references = {k if isinstance(k, tuple) else (k,): g["_spt"].tolist()
                  for k, g in ar.groupby(ar_keys, sort=False, dropna=False)} if not ar.empty else {}
    other = set(other_family)
    rows = []
    for key, group in frame.groupby(keys, sort=False, dropna=False):
        row = _group_label(key if isinstance(key, tuple) else (key,), keys)
        for col in SETUP_COLUMNS:  # equal within a setup
            if col in group.columns and col not in row:
                value = group[col].iloc[0]
                row[col] = None if value is pd.NA or isinstance(value, float) and np.isnan(value) else value
        n = len(group)
        row["n"] = n
        row["warning"] = f"only {n} sample(s): spread unreliable" if n < FEW_SAMPLES else ""
        for q in PERCENTILES if not by_prompt else (50,):
            row[f"latency_p{q}_s"], row[f"latency_p{q}_lo"], row[f"latency_p{q}_hi"] = percentile_ci(
                group["latency_s"], q)
        row["ttft_p50_s"], row["ttft_p50_lo"], row["ttft_p50_hi"] = percentile_ci(group["ttft_s"].dropna(), 50)
        acc = group["acceptance_rate"].dropna()
        row["acceptance_mean"] = float(acc.mean()) if len(acc) else float("nan")
        row["acceptance_lo"], row["acceptance_hi"] = bootstrap_ci(acc, np.mean) if len(acc) else (np.nan, np.nan)
        row["tokens_per_target_pass"] = float(group["new_tokens"].sum() / max(1, group["target_forward_passes"].sum()))
        ref = references.get(tuple(row[k] for k in ar_keys))
        row["speedup_note"] = ""
        if row["method"] == "diffusion" and row["preset"] in other:
            speedup = (np.nan, np.nan, np.nan)
            row["speedup_note"] = "no speedup: the diffusion model is of another family (other tokenizer, other model)"
        elif row["method"] == "autoregressive":
            speedup = (1.0, np.nan, np.nan)
            row["speedup_note"] = "the reference"
        elif ref:
            speedup = ratio_ci(ref, group["_spt"])
        else:
            speedup = (np.nan, np.nan, np.nan)
            row["speedup_note"] = "no autoregressive run of the same preset, temperature and precision to compare with"
        row["speedup"], row["speedup_lo"], row["speedup_hi"] = speedup
        rows.append(row)
    return pd.DataFrame(rows)
