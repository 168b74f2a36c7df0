"""Figures and the HTML report of an engine workload (also drawn live by the app's Engine tab)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from explorer.engine.client import RequestRecord
from explorer.engine.traffic import EngineBench, summary_rows
from explorer.measure.report import PALETTE, Section, _layout, write_report


def _labels(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["label"])) if len(frame) else []


def latency_figure(summary: pd.DataFrame, what: str = "e2e", title: str | None = None) -> go.Figure:
    """p50 (solid) and p99 (dashed) of a latency against concurrency, one colour per server."""
    fig = go.Figure()
    for i, label in enumerate(_labels(summary)):
        part = summary[summary["label"] == label].sort_values("concurrency")
        for q, dash in (("p50", "solid"), ("p99", "dash")):
            fig.add_trace(go.Scatter(x=part["concurrency"], y=part[f"{what}_{q}_ms"], mode="lines+markers",
                                     name=f"{label} {q}", line={"color": PALETTE[i % len(PALETTE)], "dash": dash}))
    fig.update_xaxes(title="concurrency (requests in flight)", type="log", dtick=math.log10(2))
    fig.update_yaxes(title=f"{what.upper()} (ms)", rangemode="tozero")
    names = {"e2e": "end-to-end latency", "itl": "inter-chunk latency", "ttft": "time to first token"}
    return _layout(fig, title or f"{names.get(what, what)}: p50 and p99 against concurrency", 380)


def throughput_figure(summary: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for i, label in enumerate(_labels(summary)):
        part = summary[summary["label"] == label].sort_values("concurrency")
        fig.add_trace(go.Scatter(x=part["concurrency"], y=part["throughput_tok_s"], mode="lines+markers", name=label,
                                 line={"color": PALETTE[i % len(PALETTE)]}))
    fig.update_xaxes(title="concurrency", type="log", dtick=math.log10(2))
    fig.update_yaxes(title="output tokens / s (all requests)", rangemode="tozero")
    return _layout(fig, "Throughput against concurrency", 380)


def gain_figure(summary: pd.DataFrame, predicted: pd.DataFrame | None = None) -> go.Figure:
    """Measured gain of speculation over the baseline (throughput ratio) against concurrency, beside the
    prediction from the explorer's cost model."""
    fig = go.Figure()
    if "speedup_throughput" in summary:
        for i, label in enumerate(_labels(summary)):
            part = summary[(summary["label"] == label) & summary["speedup_throughput"].notna()]
            if len(part):
                part = part.sort_values("concurrency")
                fig.add_trace(go.Scatter(x=part["concurrency"], y=part["speedup_throughput"], mode="lines+markers",
                                         name=f"{label}: measured", line={"color": PALETTE[i % len(PALETTE)]}))
    if predicted is not None and len(predicted):
        labels = _labels(summary)
        for label, part in predicted.groupby("label", sort=False):
            i = labels.index(label) if label in labels else len(labels)
            noisy = [n for n in part.get("noisy", []) if n]
            fig.add_trace(go.Scatter(x=part["concurrency"], y=part["predicted_gain"], mode="lines+markers",
                                     name=f"{label}: predicted" + (f" ({noisy[0]})" if noisy else ""),
                                     text=list(part.get("noisy", [""] * len(part))),
                                     hovertemplate="c=%{x}: predicted %{y:.2f}x %{text}<extra></extra>",
                                     line={"color": PALETTE[i % len(PALETTE)], "dash": "dot"}))
    fig.add_hline(y=1.0, line={"color": "#bbb", "width": 1})
    fig.update_xaxes(title="concurrency", type="log", dtick=math.log10(2))
    fig.update_yaxes(title="throughput, speculation on / off", rangemode="tozero")
    return _layout(fig, "The batch effect, measured: speculation's gain against concurrency", 380)


def acceptance_over_time_figure(records: Sequence[RequestRecord]) -> go.Figure:
    """Tokens per engine step of each finished request (inferred from its stream), in the order they ended."""
    fig = go.Figure()
    labels = list(dict.fromkeys(r.label for r in records))
    for i, label in enumerate(labels):
        mine = sorted((r for r in records if r.label == label and r.error is None and r.bursts),
                      key=lambda r: r.sent + (r.done or 0))
        if not mine:
            continue
        t0 = min(r.sent for r in records)
        x = [r.sent + (r.done or 0) - t0 for r in mine]
        y = [sum(r.bursts) / len(r.bursts) for r in mine]
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=label, marker={"color": PALETTE[i % len(PALETTE)],
                                                                                 "size": 6},
                                 text=[f"c={r.concurrency} {r.prompt_id}" for r in mine]))
    fig.update_xaxes(title="seconds since the workload started")
    fig.update_yaxes(title="tokens per step (inferred from the stream)", rangemode="tozero")
    return _layout(fig, "Acceptance over time: tokens per engine step, request by request", 380)


def bench_sections(bench: EngineBench, baseline: str | None, predicted: pd.DataFrame | None = None,
                   notes: Sequence[str] = ()) -> list[Section]:
    summary = pd.DataFrame(summary_rows(bench, baseline))
    if not len(summary):
        return [Section("No request finished", notes=list(notes) + ([bench.error] if bench.error else []))]
    figures = [latency_figure(summary, "e2e"), latency_figure(summary, "itl"), latency_figure(summary, "ttft"),
               throughput_figure(summary), acceptance_over_time_figure(bench.records)]
    if baseline is not None:
        figures.insert(0, gain_figure(summary, predicted))
    tables = {"per server and concurrency": summary}
    if predicted is not None and len(predicted):
        tables["prediction"] = predicted
    run_notes = list(notes)
    if bench.error:
        run_notes.insert(0, f"The run ended early: {bench.error}. Every row measured before that is kept.")
    run_notes.append("ITL is the gap between consecutive streamed chunks; with speculation one chunk is one engine "
                     "step and may carry several tokens. 'tokens_per_chunk_inferred' and 'accepted_inferred' are "
                     "inferred from the stream; 'acceptance', 'tokens_per_step' and 'acceptance_by_position' are "
                     "the server's own /metrics counters over the config ('unavailable' where it exports none).")
    return [Section("Engine workload", figures, tables, run_notes)]


def write_bench_report(path: str | Path, bench: EngineBench, header: dict[str, str], baseline: str | None,
                       predicted: pd.DataFrame | None = None, notes: Sequence[str] = ()) -> Path:
    return write_report(path, header, bench_sections(bench, baseline, predicted, notes))
