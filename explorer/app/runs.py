"""Run history: every Run of this page (per browser session, the last RUNS_LIMIT), kept with what it was run
with, so runs with different prompts, drafters, γ, temperatures or playbacks are told apart; a table of them,
their labels for legends and pickers, a compare figure of chosen runs' acceptance, and each speedup with the
playback it came from and, once several runs share a setup, its spread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.app import plots
from explorer.decoding.events import Trace
from explorer.measure.metrics import verification_frame

RUNS_LIMIT = 20  # runs kept per browser session
HISTORY_COLUMNS = ["run", "prompt", "preset", "drafter", "γ", "T", "precision", "playback", "acceptance",
                   "spec speedup vs AR", "diffusion vs AR"]
HISTORY_WIDTHS = ["4%", "15%", "7%", "9%", "4%", "4%", "8%", "6%", "9%", "17%", "17%"]  # fits 1280 px


def short(text: str, chars: int = 24) -> str:
    one = " ".join(text.split())
    return f"“{one[:chars]}…”" if len(one) > chars else f"“{one}”"


def number(value: Any) -> str:
    """A setting as the page shows it: an integer without ".0", other numbers as they are."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def make_run(number_: int, prompt: str, preset: str, current: dict[str, Any], playback: str,
             table: pd.DataFrame | None = None, caption: str = "") -> dict[str, Any]:
    """One run as the history keeps it: its settings, its traces (the lanes' replay state) and its run table."""
    traces: Mapping[str, Trace] = current["traces"]
    any_trace = traces.get("speculative") or next(iter(traces.values()))
    cfg = any_trace.config
    spec_cfg = traces["speculative"].config if "speculative" in traces else {}
    return {"number": number_, "prompt": prompt, "preset": preset, "playback": playback,
            "drafter": spec_cfg.get("drafter", "–"), "gamma": spec_cfg.get("gamma", "–"),
            "temperature": cfg.get("temperature"), "precision": precision(traces), "current": current,
            "table": table, "caption": caption,
            # every lane's setup (decoding/config.setup_label): runs pool their speedups only when all are equal
            "setups": tuple(sorted((m, plots.setup_of(t)) for m, t in traces.items()))}


def precision(traces: Mapping[str, Trace]) -> str:
    """The precision the lanes decoded in ("int8", or "float32 · diffusion bfloat16"): a trace's precision, or
    its dtype where an older trace has none."""
    dtypes = {m: lane_precision(t) for m, t in traces.items()}
    main = next((d for m, d in dtypes.items() if m != "diffusion"), dtypes.get("diffusion", "?"))
    other = dtypes.get("diffusion")
    return main if other in (None, main) else f"{main} · diffusion {other}"


def lane_precision(trace: Trace) -> str:
    """What a lane decoded in: its precision (int8 on the kernels keeps float32 tensors), or an older trace's dtype."""
    return str(trace.stats.get("precision") or trace.stats.get("dtype"))


def add_run(runs: list[dict] | None, run: dict) -> list[dict]:
    """The history with ``run`` appended, at most RUNS_LIMIT long (the oldest dropped)."""
    return [*(runs or []), run][-RUNS_LIMIT:]


def run_label(run: dict) -> str:
    """What tells runs apart in a legend or a picker: number, prompt, drafter, γ, T, playback."""
    spec = f"{run['drafter']} γ={number(run['gamma'])}, " if run["drafter"] != "–" else ""
    return (f"run {run['number']}: {short(run['prompt'], 18)} {spec}T={number(run['temperature'])}, "
            f"{run['playback']}")


def setup_key(run: dict) -> tuple:
    """Runs with equal keys measured the same thing (their speedups may be pooled into a spread)."""
    return (run["prompt"], run["preset"], run["drafter"], run["gamma"], run["temperature"], run["precision"],
            run["playback"], run.get("setups"))


def speedup_cell(run: dict, runs: Sequence[dict], method: str = "speculative") -> str:
    """``method``'s per-token speedup against this run's AR lane, with the playback (and precision) it came from;
    with several runs of the same setup, their median and range."""
    traces = run["current"]["traces"]
    if method not in traces:
        return "–"
    if "autoregressive" not in traces:
        return "no AR lane"
    lane, reference = traces[method], traces["autoregressive"]
    if lane_precision(lane) != lane_precision(reference):
        return f"not comparable ({lane_precision(lane)} vs {lane_precision(reference)})"
    same = [r for r in runs if setup_key(r) == setup_key(run) and r["number"] <= run["number"]
            and {method, "autoregressive"} <= set(r["current"]["traces"])]
    values = [plots.measured_speedup(r["current"]["traces"][method], r["current"]["traces"]["autoregressive"])
              for r in same] or [plots.measured_speedup(lane, reference)]
    where = f"{run['playback']}, {lane_precision(lane)}"
    if len(values) == 1:
        return f"{values[0]:.2f}× (1 run, {where})"
    return (f"{float(np.median(values)):.2f}× (median of {len(values)} runs, {where}: "
            f"{min(values):.2f}–{max(values):.2f})")


def acceptance(run: dict) -> str:
    spec = run["current"]["traces"].get("speculative")
    if spec is None:
        return "–"
    proposed, accepted = spec.stats["proposed"], spec.stats["accepted"]
    return f"{accepted / proposed:.0%} ({accepted}/{proposed})" if proposed else "– (nothing drafted)"


def history_table(runs: Sequence[dict]) -> pd.DataFrame:
    """One row per run of this page, newest first."""
    rows = [{"run": r["number"], "prompt": short(r["prompt"], 40), "preset": r["preset"], "drafter": r["drafter"],
             "γ": number(r["gamma"]), "T": number(r["temperature"]), "precision": r["precision"],
             "playback": r["playback"], "acceptance": acceptance(r), "spec speedup vs AR": speedup_cell(r, runs),
             "diffusion vs AR": speedup_cell(r, runs, "diffusion")} for r in reversed(runs)]
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def labelled_speculative(runs: Sequence[dict], last: int = 5) -> list[tuple[str, Trace]]:
    """The speculative lanes of the last few runs, each with its run's label (for the running-acceptance plot)."""
    return [(run_label(r), r["current"]["traces"]["speculative"]) for r in runs
            if "speculative" in r["current"]["traces"]][-last:]


def earlier_points(runs: Sequence[dict], last: int = 4) -> list[tuple[str, Trace, Trace]]:
    """(label, speculative, autoregressive) of the runs before the latest that have both lanes in one dtype: their
    measured points on the break-even plot."""
    both = [r for r in runs[:-1] if {"speculative", "autoregressive"} <= set(r["current"]["traces"])]
    return [(run_label(r), r["current"]["traces"]["speculative"], r["current"]["traces"]["autoregressive"])
            for r in both if not speedup_cell(r, [r]).startswith("not comparable")][-last:]


def compare_figure(runs: Sequence[dict], chosen: Sequence[str] | None) -> go.Figure:
    """The chosen runs' acceptance side by side: overall (accepted / proposed) and after each verify step."""
    title = "Compare runs: acceptance side by side"
    picked = [r for r in runs if run_label(r) in (chosen or ()) and "speculative" in r["current"]["traces"]]
    caption = plots.setup_caption([r["current"]["traces"]["speculative"] for r in picked])
    if not picked:
        return plots.empty_figure(title, caption, "Choose runs with a speculative lane to compare their acceptance.")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6], horizontal_spacing=0.1)
    for i, r in enumerate(picked):
        spec = r["current"]["traces"]["speculative"]
        proposed = spec.stats["proposed"]
        rate = spec.stats["accepted"] / proposed if proposed else 0.0
        colour = plots.RUN_COLOURS[i % len(plots.RUN_COLOURS)]
        fig.add_bar(x=[f"run {r['number']}"], y=[rate], name=run_label(r), marker_color=colour, legendgroup=str(i),
                    text=[f"{rate:.0%}"], textposition="outside", row=1, col=1,
                    hovertemplate=f"{run_label(r)}<br>accepted / proposed %{{y:.0%}}<extra></extra>")
        frame = verification_frame(spec)
        if not frame.empty:
            fig.add_scatter(x=frame["step"] + 1, y=frame["running_acceptance"], mode="lines", name=run_label(r),
                            line={"color": colour}, legendgroup=str(i), showlegend=False, row=1, col=2)
    fig.update_yaxes(range=[0, 1.1], tickformat=".0%", title_text="accepted / proposed", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=2)
    fig.update_xaxes(title_text="verify step", row=1, col=2)
    fig = plots.style_figure(fig, title, caption)
    fig.update_layout(height=plots.HEIGHT + 20 * len(picked), margin={"b": 60 + 24 * len(picked)})
    return fig
