"""Traces -> pandas DataFrames -> the numbers a deployment decision needs."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from explorer.events import Proposal, Trace, Verification

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
    """One row per request: latency, TTFT, ITL p50/p99 within the request, acceptance, passes."""
    s = trace.stats
    itl = inter_token_latencies(trace)
    return {
        "method": trace.method,
        "preset": s["preset"],
        "drafter": s.get("drafter"),
        "gamma": s.get("gamma"),
        "steps": s.get("steps"),
        "temperature": trace.config.get("temperature"),
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
        **extra,
    }


def requests_frame(traces: Iterable[Trace]) -> pd.DataFrame:
    return pd.DataFrame([request_row(t) for t in traces])


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
