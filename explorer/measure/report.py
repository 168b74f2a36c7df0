"""Benchmark figures (plotly) and the self-contained HTML report.

Figure functions take the DataFrames ``explorer.measure.bench`` produces and return a
``go.Figure``; nothing here runs a model, so the UI can reuse them on saved results.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
from plotly.subplots import make_subplots

from explorer.measure.metrics import PERCENTILES, percentile

MS = 1000.0
COLORS = {"autoregressive": "#4c78a8", "speculative": "#f58518", "diffusion": "#54a24b",
          "hf_greedy": "#9ecae9", "hf_assisted": "#ffbf79", "hf_prompt_lookup": "#b279a2"}
PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"]


@dataclass
class Section:
    """One part of the report: figures, tables and the sentences that say what they show."""

    title: str
    figures: list[go.Figure] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title=title, height=height, template="plotly_white", margin=dict(t=70, l=60, r=20, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=-0.35))
    return fig


# ---------------------------------------------------------------------------------------------
# the plain bench

def tail_latency_figure(frame: pd.DataFrame) -> go.Figure:
    """Request latency, TTFT and pooled inter-token latency per config: every request, p50/p95/p99 marked."""
    fig = make_subplots(1, 3, subplot_titles=("request latency (ms)", "time to first token (ms)",
                                              "inter-token latency, all gaps (ms)"))
    for i, (label, group) in enumerate(frame.groupby("config", sort=False)):
        itl = [gap for gaps in group["itl_s"] for gap in gaps] if "itl_s" in group else []
        for col, values in enumerate([group["latency_s"], group["ttft_s"], itl], start=1):
            values = [v * MS for v in values if v is not None and math.isfinite(v)]
            fig.add_trace(go.Box(y=values, name=label, marker_color=_color(i), boxpoints="all" if len(values) < 400
                                 else False, jitter=0.4, pointpos=0, showlegend=col == 1, legendgroup=label), 1, col)
            marks = [percentile(values, q) for q in PERCENTILES]
            fig.add_trace(go.Scatter(x=[label] * 3, y=marks, mode="markers+text", text=["p50", "p95", "p99"],
                                     textposition="middle right", marker=dict(symbol="line-ew-open", size=18,
                                                                              color="black"),
                                     showlegend=False, hoverinfo="y+text"), 1, col)
    fig.update_xaxes(showticklabels=False)
    return _layout(fig, "Tail latency per configuration (one point per request)", 460)


def throughput_figure(summary: pd.DataFrame) -> go.Figure:
    """Tokens/s and speedup against autoregressive decoding, per prompt set and config."""
    fig = make_subplots(1, 2, subplot_titles=("tokens per second", "speedup vs autoregressive (tokens/s ratio)"))
    for i, (label, group) in enumerate(summary.groupby("config", sort=False)):
        fig.add_trace(go.Bar(x=group["prompt_set"], y=group["tokens_per_s"], name=label, marker_color=_color(i),
                             legendgroup=label), 1, 1)
        fig.add_trace(go.Bar(x=group["prompt_set"], y=group["speedup"], name=label, marker_color=_color(i),
                             legendgroup=label, showlegend=False), 1, 2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=2)
    return _layout(fig, "Throughput")


def speed_quality_figure(summary: pd.DataFrame) -> go.Figure:
    """Speed against quality: generative perplexity under the judge (lower is better) vs tokens/s."""
    fig = go.Figure()
    for i, (label, group) in enumerate(summary.groupby("config", sort=False)):
        fig.add_trace(go.Scatter(
            x=group["tokens_per_s"], y=group["perplexity_mean"], mode="markers+text", name=label,
            text=group["prompt_set"], textposition="top center", marker=dict(size=12, color=_color(i)),
            customdata=group[["token_entropy_bits_mean"]].to_numpy(),
            hovertemplate="%{text}<br>%{x:.1f} tok/s<br>perplexity %{y:.2f}<br>entropy %{customdata[0]:.2f} bits"))
    fig.update_xaxes(title="tokens per second")
    fig.update_yaxes(title="generative perplexity (judge: target)", type="log")
    return _layout(fig, "Quality next to speed (hover: token entropy; near 0 bits = repetition)")


# ---------------------------------------------------------------------------------------------
# sweeps

def sweep_figure(summary: pd.DataFrame, x: str, x_title: str, title: str) -> go.Figure:
    """Measured speedup (and the predicted ones where present) and acceptance rate against a swept value.

    Numeric x: lines; categorical x (e.g. drafter): grouped bars. One trace per prompt set.
    """
    rows = summary[summary["method"] != "autoregressive"]
    numeric = pd.api.types.is_numeric_dtype(rows[x])
    fig = make_subplots(1, 2, subplot_titles=("speedup vs autoregressive", "draft acceptance rate"))
    for i, (name, group) in enumerate(rows.groupby("prompt_set", sort=False)):
        group = group.sort_values(x) if numeric else group
        series = [("speedup", "measured", "solid"), ("predicted_speedup_forward", "predicted (forward times)", "dash"),
                  ("predicted_speedup_thm", "predicted (Thm 3.8, c)", "dot")]
        for col, what, dash in series:
            if col not in group or group[col].isna().all():
                continue
            label = f"{name}: {what}"
            if numeric:
                fig.add_trace(go.Scatter(x=group[x], y=group[col], name=label, mode="lines+markers",
                                         line=dict(color=_color(i), dash=dash)), 1, 1)
            elif col == "speedup":
                fig.add_trace(go.Bar(x=group[x].astype(str), y=group[col], name=label, marker_color=_color(i)), 1, 1)
            else:
                fig.add_trace(go.Scatter(x=group[x].astype(str), y=group[col], name=label, mode="markers",
                                         marker=dict(color=_color(i), symbol="diamond-open", size=12)), 1, 1)
        acc = group["acceptance_rate_mean"]
        kind = go.Scatter if numeric else go.Bar
        extra = {"mode": "lines+markers", "line": dict(color=_color(i))} if numeric else {"marker_color": _color(i)}
        fig.add_trace(kind(x=group[x] if numeric else group[x].astype(str), y=acc, name=f"{name}: acceptance",
                           showlegend=False, **extra), 1, 2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=1, annotation_text="no speedup")
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    return _layout(fig, title, 460)


def breakeven_figure(points: pd.DataFrame, crossings: pd.DataFrame) -> go.Figure:
    """Median request latency against output length N; diffusion at several K; crossovers marked."""
    fig = go.Figure()
    for i, (series, group) in enumerate(points.groupby("series", sort=False)):
        method = group["method"].iloc[0]
        dash = "solid" if method != "diffusion" else "dash"
        fig.add_trace(go.Scatter(x=group["n"], y=group["latency_p50_s"] * MS, name=series, mode="lines+markers",
                                 line=dict(color=COLORS.get(method) if method != "diffusion" else _color(i + 2),
                                           dash=dash)))
    for _, row in crossings.iterrows():
        if row["n_cross"] is None or not math.isfinite(row["n_cross"]):
            continue
        fig.add_trace(go.Scatter(x=[row["n_cross"]], y=[row["latency_cross_s"] * MS], mode="markers+text",
                                 marker=dict(symbol="x", size=14, color="black"), showlegend=False,
                                 text=[f"N≈{row['n_cross']:.0f}"], textposition="top left",
                                 hovertext=f"{row['series']} meets {row['against']} at N≈{row['n_cross']:.0f}"))
    fig.update_xaxes(title="output length N (tokens, fixed: EOS ignored)", type="log", dtick=math.log10(2))
    fig.update_yaxes(title="median request latency (ms)", type="log")
    return _layout(fig, "Break-even: latency against output length (x: crossovers)", 480)


def batch_figure(frame: pd.DataFrame) -> go.Figure:
    """Cost ratios against batch size and the speedup they predict (predicted, not measured)."""
    fig = make_subplots(1, 2, subplot_titles=("cost ratios (measured forward times)",
                                              "predicted speedup from measured acceptance"))
    for col, name, i in [("cost_ratio_c", "c = draft pass / target pass (B×1)", 0),
                         ("verify_ratio", "target pass B×(γ+1) / B×1", 1)]:
        fig.add_trace(go.Scatter(x=frame["batch"], y=frame[col], name=name, mode="lines+markers",
                                 line=dict(color=_color(i))), 1, 1)
    for col, name, i in [("predicted_speedup_thm", "predicted, Thm 3.8 (verify pass = 1 target pass)", 2),
                         ("predicted_speedup_forward", "predicted, with measured verify cost", 3)]:
        fig.add_trace(go.Scatter(x=frame["batch"], y=frame[col], name=name, mode="lines+markers",
                                 line=dict(color=_color(i), dash="dash")), 1, 2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=2, annotation_text="break-even")
    fig.update_xaxes(title="batch size B", type="log", dtick=math.log10(2))
    return _layout(fig, "Batch size: what a target pass on γ+1 tokens costs, and what that predicts", 460)


def memory_figure(frame: pd.DataFrame) -> go.Figure:
    """Weights and KV-cache bytes per method configuration, at each batch size and sequence length."""
    fig = go.Figure()
    frame = frame.assign(where=[f"B={b}, L={n}" for b, n in zip(frame["batch"], frame["seq_len"], strict=True)])
    parts = [("target_weights_bytes", "target weights"), ("draft_weights_bytes", "draft weights"),
             ("target_kv_bytes", "target KV cache"), ("draft_kv_bytes", "draft KV cache"),
             ("diffusion_weights_bytes", "diffusion weights")]
    for i, (col, name) in enumerate(parts):
        fig.add_trace(go.Bar(x=[frame["where"], frame["config"]], y=frame[col] / 2**20, name=name,
                             marker_color=_color(i)))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="MiB")
    return _layout(fig, "Memory: weights and KV cache per configuration", 480)


def peer_figure(frame: pd.DataFrame) -> go.Figure:
    """Median latency of ours against transformers' generate on the same models and prompts."""
    fig = go.Figure()
    for i, (impl, group) in enumerate(frame.groupby("implementation", sort=False)):
        med = group.groupby("pair", sort=False)["latency_s"].median() * MS
        fig.add_trace(go.Bar(x=list(med.index), y=list(med.values), name=impl, marker_color=_color(i)))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="median request latency (ms)")
    return _layout(fig, "Ours against transformers' generate (same models, prompts, interleaved)")


# ---------------------------------------------------------------------------------------------
# the checklist (explorer decide)

def frontier_figure(rows: list[dict]) -> go.Figure:
    """Each diffusion setting measured (decide.diffusion_rows): tokens per denoiser pass (faster to the right)
    against repeated words (worse up), the target's own rate as a dashed line; a filled marker where quality holds
    (decide.QUALITY_RULE), an open one where it does not. A trace per setting: labels on the points overlap."""
    def num(x: object) -> str:
        return "–" if x is None or isinstance(x, float) and not math.isfinite(x) else f"{float(x):.3g}"

    fig = go.Figure()
    if rows:
        fig.add_hline(y=100 * rows[0]["ar_repeat_rate"], line_dash="dash", line_color="#555",
                      annotation_text="autoregressive (the target)", annotation_position="top left")
    for i, r in enumerate(rows):
        holds = r["quality_holds"]
        fig.add_trace(go.Scatter(
            x=[r.get("tokens_per_pass")], y=[100 * r["repeat_rate"]], mode="markers",
            name=f"{r['config']}{'' if holds else ' (quality does not hold)'}",
            marker={"size": 12, "symbol": "circle" if holds else "circle-open", "color": _color(i),
                    "line": {"width": 2}},
            customdata=[[num(r["median_perplexity"]), num(r.get("distinct_3")), num(r["speedup_vs_ar"])]],
            hovertemplate=f"{r['config']}<br>%{{x:.2f}} tokens per pass, %{{y:.1f}}% repeated words<br>perplexity "
                          "%{customdata[0]}, distinct 3-grams %{customdata[1]}, %{customdata[2]}x autoregressive"
                          "<extra></extra>"))
    fig.update_xaxes(title="answer tokens per denoiser pass")
    fig.update_yaxes(title="adjacent repeated words (%)")
    return _layout(fig, "Diffusion: tokens per pass against repeated words", 460)


# ---------------------------------------------------------------------------------------------
# the page

def write_report(path: str | Path, header: dict[str, str], sections: list[Section],
                 title: str = "Decoding explorer: benchmark report") -> Path:
    """One HTML file with plotly.js inline (works offline), the header, then every section."""
    path = Path(path)
    head_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in header.items())
    body = [f"<h1>{html.escape(title)}</h1><table class='header'>{head_rows}</table>"]
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        body += [f"<p>{html.escape(note)}</p>" for note in section.notes]
        body += [fig.to_html(full_html=False, include_plotlyjs=False) for fig in section.figures]
        for name, table in section.tables.items():
            body.append(f"<h3>{html.escape(name)}</h3>")
            table_html = table.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="", border=0)
            body.append(f"<div class='scroll'>{table_html}</div>")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
            "table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #ddd;"
            "text-align:left}table.header th{width:12em}.scroll{overflow-x:auto}</style>"
            f"<script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head><body>"
            + "\n".join(body) + "</body></html>")
    path.write_text(page, encoding="utf-8")
    return path
