"""Plotly figures from traces: acceptance, tail latency, diffusion reveals, break-even.

Each function takes finished traces (and the model names of the preset) and returns a
``plotly.graph_objects.Figure`` whose subtitle states device, dtype, batch size and models,
so a screenshot of any one figure is self-describing. No Gradio here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.decoding.config import setup_label
from explorer.decoding.events import Proposal, RefinementStep, Trace, Verification
from explorer.measure.metrics import (
    inter_token_latencies,
    noise_flag,
    percentile,
    predicted_speedup,
    verification_frame,
)

METHOD_COLOURS = {"autoregressive": "#6b7280", "speculative": "#16a34a", "diffusion": "#0891b2"}
PERCENTILE_COLOURS = {50: "#60a5fa", 95: "#f59e0b", 99: "#dc2626"}
RUN_COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
HEIGHT = 380
# what each figure shows before any run (its empty state says what will appear)
EMPTY = {
    "running_acceptance": ("Press Run with the speculative lane: its acceptance rate after each<br>"
                           "verify step appears here, live as the lanes play."),
    "position_acceptance": ("Press Run with the speculative lane: how often the 1st, 2nd, … draft<br>"
                            "of a step is accepted appears here."),
    "accepted_histogram": ("Press Run with the speculative lane: how many drafts each verify step<br>"
                           "kept (0 … γ) appears here."),
    "break_even": ("Press Run with the speculative lane: the predicted speedup against α<br>"
                   "and this run's measured point appear here."),
    "latency_percentiles": ("Press Run: TTFT, inter-token and request latency (p50/p95/p99)<br>"
                            "per lane appear here."),
    "latency_cdf": ("Press Run: the distribution of request and inter-token latency<br>"
                    "over this session's runs appears here."),
    "diffusion_reveals": ("Press Run with the diffusion lane: how many masks each refinement<br>"
                          "step revealed appears here."),
}


def setup_caption(traces: Iterable[Trace], names: Mapping[str, str] | None = None) -> str:
    """'device · dtype · batch size · preset' and the model names, on two lines."""
    traces = list(traces)

    def distinct(key: str) -> str:
        return "/".join(dict.fromkeys(str(t.stats.get(key)) for t in traces)) or "?"

    line1 = (f"device {distinct('device')} · {distinct('dtype')} · batch size {distinct('batch_size')} · "
             f"preset {distinct('preset')} · {len(traces)} run(s)")
    models = " · ".join(f"{role}: {name}" for role, name in (names or {}).items())
    return f"{line1}<br>{models}" if models else line1


def style_figure(fig: go.Figure, title: str, caption: str, **kwargs: object) -> go.Figure:
    fig.update_layout(title={"text": title, "subtitle": {"text": caption, "font": {"size": 11}}, "x": 0.01},
                      template="plotly_white", height=HEIGHT, margin={"l": 60, "r": 20, "t": 90, "b": 95},
                      paper_bgcolor="white", legend={"orientation": "h", "y": -0.22, "yanchor": "top"}, **kwargs)
    return fig


def empty_figure(title: str, caption: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 13, "color": "#6b7280"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style_figure(fig, title, caption)


def _of(traces: Iterable[Trace], method: str) -> list[Trace]:
    return [t for t in traces if t.method == method]


def _run_label(i: int, trace: Trace) -> str:
    cfg, prompt = trace.config, " ".join(trace.prompt.split())
    prompt = f"“{prompt[:18]}…”" if len(prompt) > 18 else f"“{prompt}”"
    return f"{i + 1}: {prompt} {cfg.get('drafter')} γ={cfg.get('gamma')}, T={cfg.get('temperature'):g}"


# ----------------------------------------------------------------------------------------------
# speculative

def running_acceptance_figure(traces: Sequence[Trace], names: Mapping[str, str] | None = None,
                              last: int = 5, labelled: Sequence[tuple[str, Trace]] | None = None) -> go.Figure:
    """Cumulative acceptance rate (accepted / proposed) after each verify step, last few runs; ``labelled``
    gives each run's own label (the page's run history: prompt, drafter, γ, T, playback)."""
    title = "Running acceptance rate over verify steps"
    if labelled is None:
        labelled = [(_run_label(i, t), t) for i, t in enumerate(_of(traces, "speculative"))]
    labelled = list(labelled)[-last:]
    spec = [t for _, t in labelled]
    caption = setup_caption(spec, names)
    if not spec:
        return empty_figure(title, caption, EMPTY["running_acceptance"])
    fig = go.Figure()
    for i, (label, trace) in enumerate(labelled):
        frame = verification_frame(trace)
        if frame.empty:
            continue
        fig.add_scatter(x=frame["step"] + 1, y=frame["running_acceptance"], mode="lines+markers", name=label,
                        line={"color": RUN_COLOURS[i % len(RUN_COLOURS)]},
                        opacity=1.0 if i == len(labelled) - 1 else 0.55)
    fig.update_layout(height=HEIGHT + 22 * len(labelled), margin={"b": 70 + 22 * len(labelled)})
    fig.update_yaxes(range=[0, 1.05], title="accepted / proposed", tickformat=".0%")
    fig.update_xaxes(title="verify step (one target pass each)")
    return style_figure(fig, title, caption)


def _position_counts(traces: Sequence[Trace]) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position: how often it was checked and how often accepted."""
    checked, accepted = np.zeros(64, int), np.zeros(64, int)
    for trace in traces:
        for e in trace.events:
            if isinstance(e, Verification):
                for c in e.checks:
                    checked[c.position] += 1
                    accepted[c.position] += c.accepted
    used = int(np.max(np.nonzero(checked)[0], initial=-1)) + 1
    return checked[:used], accepted[:used]


def position_acceptance_figure(traces: Sequence[Trace], names: Mapping[str, str] | None = None) -> go.Figure:
    """P(draft i accepted | drafts before it accepted), pooled over the speculative runs given."""
    title, spec = "Acceptance by draft position", _of(traces, "speculative")
    caption = setup_caption(spec, names)
    checked, accepted = _position_counts(spec)
    if not checked.size:
        return empty_figure(title, caption, EMPTY["position_acceptance"])
    positions = np.arange(1, checked.size + 1)
    rate = np.divide(accepted, checked, out=np.zeros(checked.size), where=checked > 0)
    fig = go.Figure(go.Bar(x=positions, y=rate, marker_color=METHOD_COLOURS["speculative"],
                           text=[f"{a}/{n}" for a, n in zip(accepted, checked, strict=True)], textposition="outside",
                           hovertemplate="position %{x}<br>accepted %{y:.0%} (%{text})<extra></extra>"))
    fig.update_yaxes(range=[0, 1.15], title="accepted / checked", tickformat=".0%")
    fig.update_xaxes(title="draft position (position 1 estimates Leviathan's α)", dtick=1)
    return style_figure(fig, title, caption)


def accepted_histogram_figure(traces: Sequence[Trace], names: Mapping[str, str] | None = None) -> go.Figure:
    """How many drafts each verify step kept (0 .. γ), pooled over the runs given."""
    title, spec = "Drafts accepted per verify step", _of(traces, "speculative")
    caption = setup_caption(spec, names)
    counts = [e.accepted for t in spec for e in t.events if isinstance(e, Verification)]
    if not counts:
        return empty_figure(title, caption, EMPTY["accepted_histogram"])
    values, freq = np.unique(counts, return_counts=True)
    fig = go.Figure(go.Bar(x=values, y=freq, marker_color=METHOD_COLOURS["speculative"],
                           hovertemplate="%{x} accepted: %{y} steps<extra></extra>"))
    fig.update_xaxes(title="drafts accepted in the step (tokens emitted = accepted + 1)", dtick=1)
    fig.update_yaxes(title="verify steps")
    return style_figure(fig, title, caption)


def cost_ratio(trace: Trace) -> float:
    """c = mean draft time per draft pass / mean target time per verify pass (Leviathan et al., Sec. 3)."""
    verify = [e.forward_s for e in trace.events if isinstance(e, Verification)]
    passes = trace.stats["draft_forward_passes"] or trace.stats["proposed"]
    if not verify or not passes:
        return 0.0
    return (trace.stats["draft_forward_s"] / passes) / float(np.mean(verify))


def cost_noise(trace: Trace) -> str:
    """The noise flag of the passes c is timed from: the verify passes and the draft passes per pass, past the first
    step (its verify pass is the prefill); "" when they are tight (``metrics.noise_flag``)."""
    verify = [e.forward_s for e in trace.events if isinstance(e, Verification) and e.step > 0]
    draft = [e.forward_s / e.draft_passes for e in trace.events
             if isinstance(e, Proposal) and e.step > 0 and e.draft_passes and e.forward_s > 0]
    return noise_flag(verify, draft)


def alpha_estimate(trace: Trace) -> float:
    """Leviathan's α: the mean of min(1, p/q) over every verified draft."""
    probs = [c.accept_prob for e in trace.events if isinstance(e, Verification) for c in e.checks]
    return float(np.mean(probs)) if probs else float("nan")


def measured_speedup(spec: Trace, reference: Trace) -> float:
    """Time per token of the autoregressive reference over that of speculative decoding."""
    per_token = [t.stats["wall_s"] / max(1, t.stats["new_tokens"]) for t in (reference, spec)]
    return per_token[0] / per_token[1] if per_token[1] > 0 else float("nan")


def break_even_figure(spec: Trace | None, reference: Trace | None = None,
                      names: Mapping[str, str] | None = None, gammas: Sequence[int] = (1, 2, 4, 8),
                      earlier: Sequence[tuple[str, Trace, Trace]] = ()) -> go.Figure:
    """Predicted speedup (1 - a^(g+1)) / ((1 - a)(g c + 1)) against α, with the measured point; ``earlier``
    (label, speculative, autoregressive) adds the page's earlier runs' measured points."""
    title = "Break-even: predicted speedup vs acceptance α"
    caption = setup_caption([t for t in (spec, reference) if t is not None], names)
    if spec is None:
        return empty_figure(title, caption, EMPTY["break_even"])
    gamma, c, noisy = int(spec.stats["gamma"]), cost_ratio(spec), cost_noise(spec)
    alphas = np.linspace(0, 0.995, 200)
    fig = go.Figure()
    for g in sorted(set(gammas) | {gamma}):
        fig.add_scatter(x=alphas, y=[predicted_speedup(a, g, c) for a in alphas], mode="lines", name=f"γ = {g}",
                        line={"width": 3 if g == gamma else 1, "dash": "solid" if g == gamma else "dot"})
    fig.add_hline(y=1.0, line_dash="dash", line_color="#dc2626", annotation_text="break-even: speedup 1",
                  annotation_position="top left")
    alpha = alpha_estimate(spec)
    if np.isfinite(alpha):
        fig.add_scatter(x=[alpha], y=[predicted_speedup(alpha, gamma, c)], mode="markers",
                        name=f"predicted at α̂ ({noisy})" if noisy else "predicted at α̂",
                        marker={"size": 11, "symbol": "circle-open", "line": {"width": 2}, "color": "#111827"})
    if reference is not None and np.isfinite(alpha):
        fig.add_scatter(x=[alpha], y=[measured_speedup(spec, reference)], mode="markers", name="measured vs AR lane",
                        marker={"size": 13, "symbol": "star", "color": "#dc2626"})
    for i, (label, other, other_reference) in enumerate(earlier):
        a = alpha_estimate(other)
        if np.isfinite(a):
            fig.add_scatter(x=[a], y=[measured_speedup(other, other_reference)], mode="markers", name=label,
                            marker={"size": 10, "symbol": "star-open", "color": RUN_COLOURS[i % len(RUN_COLOURS)]})
    if earlier:
        fig.update_layout(height=HEIGHT + 22 * len(earlier), margin={"b": 95 + 22 * len(earlier)})
    fig.update_xaxes(title="α = E[min(1, p/q)] (α̂: mean over verified drafts)", range=[0, 1])
    fig.update_yaxes(title="speedup over autoregressive", rangemode="tozero")
    title = f"Break-even (γ = {gamma}, measured cost ratio c = {c:.2f})" + (f"<br>{noisy}" if noisy else "")
    style_figure(fig, title, caption)
    return fig.update_layout(margin={"t": 116}, height=fig.layout.height + 26) if noisy else fig


# ----------------------------------------------------------------------------------------------
# latency

def _latency_samples(trace: Trace) -> dict[str, list[float]]:
    """Milliseconds: TTFT, every inter-token gap, the request latency."""
    ttft = trace.stats["ttft_s"]
    return {"TTFT": [ttft * 1e3] if ttft is not None else [],
            "inter-token latency": [x * 1e3 for x in inter_token_latencies(trace)],
            "request latency": [trace.stats["wall_s"] * 1e3]}


def setup_of(trace: Trace) -> str:
    """A lane's setup in words: what must match for two traces' latencies to be pooled (every option of the
    decode that changes its distribution or cost, and the precision: decoding/config.setup_label)."""
    return setup_label(trace.method, trace.config, trace.stats.get("precision") or trace.stats.get("dtype"))


def _pooled_by_setup(traces: Sequence[Trace]) -> dict[str, dict[str, list[float]]]:
    """Latency samples per setup, never pooled across settings: a method with one setup is named by the method
    alone, else each setup by the method and its settings."""
    setups: dict[str, set[str]] = {}
    for trace in traces:
        setups.setdefault(trace.method, set()).add(setup_of(trace))
    pooled: dict[str, dict[str, list[float]]] = {}
    for trace in traces:
        label = trace.method if len(setups[trace.method]) == 1 else f"{trace.method[:4]} · {setup_of(trace)}"
        samples = pooled.setdefault(label, {"TTFT": [], "inter-token latency": [], "request latency": []})
        for key, values in _latency_samples(trace).items():
            samples[key] += values
    return pooled


def latency_percentiles_figure(traces: Sequence[Trace], names: Mapping[str, str] | None = None) -> go.Figure:
    """TTFT, inter-token latency and request latency as p50 / p95 / p99 per method and setup."""
    title, caption = "Latency percentiles per setup (ms; never pooled across settings)", setup_caption(traces, names)
    if not traces:
        return empty_figure(title, caption, EMPTY["latency_percentiles"])
    pooled = _pooled_by_setup(traces)
    metrics = ["TTFT", "inter-token latency", "request latency"]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08)
    for q in (50, 95, 99):
        for col, metric in enumerate(metrics, start=1):
            fig.add_bar(x=list(pooled), y=[percentile(pooled[m][metric], q) for m in pooled], name=f"p{q}",
                        marker_color=PERCENTILE_COLOURS[q], showlegend=col == 1, legendgroup=f"p{q}",
                        row=1, col=col, hovertemplate="%{x}: %{y:.2f} ms<extra>p" + str(q) + "</extra>")
    for col, metric in enumerate(metrics, start=1):
        fig.update_xaxes(title_text=metric, row=1, col=col)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    return style_figure(fig, title, caption)


def latency_cdf_figure(traces: Sequence[Trace], names: Mapping[str, str] | None = None) -> go.Figure:
    """Empirical CDFs over the session's runs: request latency and every inter-token gap."""
    title, caption = "Latency CDF over this session's runs", setup_caption(traces, names)
    if not traces:
        return empty_figure(title, caption, EMPTY["latency_cdf"])
    pooled = _pooled_by_setup(traces)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    for col, metric in enumerate(["request latency", "inter-token latency"], start=1):
        for i, (setup, samples) in enumerate(pooled.items()):
            values = np.sort(samples[metric])
            if not values.size:
                continue
            colour = METHOD_COLOURS.get(setup) or RUN_COLOURS[i % len(RUN_COLOURS)]
            fig.add_scatter(x=values, y=np.arange(1, values.size + 1) / values.size, mode="lines+markers",
                            line={"shape": "hv", "color": colour}, marker={"size": 4},
                            name=setup, legendgroup=setup, showlegend=col == 1, row=1, col=col)
        fig.update_xaxes(title_text=f"{metric} (ms)", row=1, col=col)
    fig.update_yaxes(title_text="fraction ≤ x", range=[0, 1.02], row=1, col=1)
    return style_figure(fig, title, caption)


# ----------------------------------------------------------------------------------------------
# diffusion

def diffusion_reveals_figure(traces: Sequence[Trace], names: Mapping[str, str] | None = None) -> go.Figure:
    """Tokens revealed at each refinement step of the latest diffusion run, coloured by block."""
    title, runs = "Diffusion: tokens revealed per step", _of(traces, "diffusion")
    caption = setup_caption(runs[-1:], names)
    if not runs:
        return empty_figure(title, caption, EMPTY["diffusion_reveals"])
    steps = [e for e in runs[-1].events if isinstance(e, RefinementStep)]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_bar(x=[e.step + 1 for e in steps], y=[len(e.positions) for e in steps], name="revealed",
                marker={"color": [e.block for e in steps], "colorscale": "Teal", "cmin": 0,
                        "cmax": max(1, max((e.block for e in steps), default=0))},
                customdata=[e.block + 1 for e in steps],
                hovertemplate="step %{x} (block %{customdata}): %{y} revealed<extra></extra>")
    fig.add_scatter(x=[e.step + 1 for e in steps], y=[e.masks_left for e in steps], name="masks left",
                    mode="lines", line={"color": "#111827"}, secondary_y=True)
    fig.update_xaxes(title="refinement step (one denoiser pass each)")
    fig.update_yaxes(title_text="tokens revealed", secondary_y=False)
    fig.update_yaxes(title_text="masks left", rangemode="tozero", secondary_y=True)
    return style_figure(fig, title, caption)


FIGURE_KEYS = ("running_acceptance", "position_acceptance", "accepted_histogram", "break_even",
               "latency_percentiles", "latency_cdf", "diffusion_reveals")


def all_figures(history: Sequence[Trace], current: Mapping[str, Trace], names: Mapping[str, str] | None = None,
                labelled: Sequence[tuple[str, Trace]] | None = None,
                earlier: Sequence[tuple[str, Trace, Trace]] = ()) -> dict[str, go.Figure]:
    """Every figure the UI shows, keyed as FIGURE_KEYS: the current run's details, the session's latency
    (``labelled``: the running-acceptance plot's runs with their labels; ``earlier``: the page's earlier runs'
    measured points on the break-even plot)."""
    latest = list(current.values())
    return {
        "running_acceptance": running_acceptance_figure(history, names, labelled=labelled),
        "position_acceptance": position_acceptance_figure(latest, names),
        "accepted_histogram": accepted_histogram_figure(latest, names),
        "break_even": break_even_figure(current.get("speculative"), current.get("autoregressive"), names,
                                        earlier=earlier),
        "latency_percentiles": latency_percentiles_figure(history, names),
        "latency_cdf": latency_cdf_figure(history, names),
        "diffusion_reveals": diffusion_reveals_figure(latest, names),
    }
