"""The measure tab's handlers: repeat a prompt or run an uploaded workload on every lane, summarize with
percentiles and bootstrap intervals, and export the session's traces."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd

import explorer
from explorer.app import hosting, plots
from explorer.app.handlers import HISTORY_LIMIT, other_family, short_text
from explorer.app.hosting import gpu
from explorer.app.lane_settings import Settings, check_inputs, load_preset
from explorer.decoding.events import Trace
from explorer.errors import ExplorerError
from explorer.measure.metrics import BOOTSTRAP_RESAMPLES, grouped_summary, requests_frame
from explorer.measure.workload import Prompt, parse_prompts, read_prompt_text

MAX_PROMPTS, MAX_PROMPT_FILE_BYTES, MAX_REPEATS, MAX_BATCH_DECODES = 200, 100_000, 20, 600


MEASURE_OUTPUTS = ("measure_status", "summary", "per_prompt", "measure_latency", "measure_cdf", "history",
                   "latency_percentiles", "latency_cdf", "measured")


def decode_key(preset: str, method: str, prompt: str, options: dict) -> tuple:
    """Two decodes with equal keys are the same measurement (same preset, lane, prompt and options)."""
    return (preset, method, prompt, tuple(sorted((k, str(v)) for k, v in options.items())))


@gpu(hosting.measure_duration)
def measure(source: str, prompt: str, prompt_file: str | None, repeats: int, preset: str, lanes: list[str],
            settings: Settings, history: list[Trace] | None,
            measured: list[tuple[tuple, Trace]] | None = None) -> Iterator[tuple]:
    """Run every lane R times over the prompt (``source="prompt"``) or the uploaded prompt file; summarize
    per setup and per prompt, with spreads, over every batch since the last Clear (``measured``: (key, trace)
    pairs). A decode already measured with the same settings (the AR baseline, a lane left unchanged) is reused,
    not run again, so no sample counts twice."""
    if source == "file" and not prompt_file:
        raise gr.Error("upload a prompt file first", print_exception=False)
    prompts = read_uploaded_prompts(prompt_file) if source == "file" else [Prompt("prompt", prompt)]
    repeats = int(repeats)
    models = load_preset(preset)
    methods = [check_inputs(models, p.text, lanes, settings) for p in prompts][0]
    total = len(prompts) * len(methods) * repeats
    if not 1 <= repeats <= MAX_REPEATS or total > MAX_BATCH_DECODES:
        raise gr.Error(f"{total} decodes requested (prompts × lanes × repeats); the limit is {MAX_BATCH_DECODES} "
                       f"and repeats must be 1..{MAX_REPEATS}", print_exception=False)
    try:
        hosting.check_measure_workload(total, settings.max_new_tokens)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    batch: list[tuple[tuple, Trace]] = []
    earlier = dict(measured or [])
    reused: dict[str, int] = {}
    batch_id = 1 + len({t.stats.get("batch") for _, t in measured or []})
    skip = (gr.skip(),) * (len(MEASURE_OUTPUTS) - 1)
    for i, (p, r, method) in enumerate((p, r, m) for p in prompts for r in range(repeats) for m in methods):
        options = settings.options(method, seed_offset=r)
        if p.temperature is not None:  # a temperature in the prompt file overrides the run's
            options["temperature"] = p.temperature
        key = decode_key(preset, method, p.text, options)
        if key in earlier:  # already measured (the AR baseline, an unchanged lane): reuse it, never duplicate it
            reused[method] = reused.get(method, 0) + 1
            continue
        done_s = sum(t.stats["wall_s"] for _, t in batch)
        left = f", about {done_s / len(batch) * (total - i):.0f} s left" if batch else ""
        yield (f"Decode {i + 1} of {total}: prompt {i // (repeats * len(methods)) + 1} of {len(prompts)}, the "
               f"{method} lane{left}", *skip)
        try:  # lanes run one at a time, so every decode is timed alone
            trace = explorer.decode(method, models, p.text, **options)
        except ExplorerError as exc:
            raise gr.Error(f"prompt {p.id}: {exc}", print_exception=False) from None
        trace.stats["batch"] = f"measure {batch_id}"
        batch.append((key, trace))
    history = [*(history or []), *(t for _, t in batch)]
    dropped = max(0, len(history) - HISTORY_LIMIT)
    history = history[-HISTORY_LIMIT:]
    measured = [*(measured or []), *batch][-HISTORY_LIMIT:]
    traces = [t for _, t in measured]
    frame = requests_frame(traces)
    family = [preset] if other_family(models) else []
    batches = len({t.stats.get("batch") for t in traces})
    again = ", ".join(f"{n} {method}" for method, n in reused.items())
    note = (f"Done: {total - sum(reused.values())} decodes" + (f" ({again} decodes reused from an earlier batch with "
                                                               "the same settings, not run again)" if reused else "")
            + f". Seeds {int(settings.seed)}..{int(settings.seed) + repeats - 1} (one per repeat). The tables "
            f"hold {batches} batch(es), {len(traces)} decodes, until **Clear**. The session holds {len(history)} "
            "traces; **Export** writes all of them"
            + (f" (the oldest {dropped} were dropped: the session keeps at most {HISTORY_LIMIT})." if dropped else ".")
            + f" Brackets: 95% bootstrap interval ({BOOTSTRAP_RESAMPLES} resamples); ⚠ marks fewer than 5 samples.")
    yield (note, summary_table(grouped_summary(frame, family)),
           summary_table(grouped_summary(frame, family, by_prompt=True), by_prompt=True),
           plots.latency_percentiles_figure(traces, models.names), plots.latency_cdf_figure(traces, models.names),
           history, plots.latency_percentiles_figure(history, models.names),
           plots.latency_cdf_figure(history, models.names), measured)


def clear_measured() -> tuple:
    """Forget the batches the tables summarize (the session's traces, and Export, keep them)."""
    return ("Cleared: the next batch starts the tables afresh (Export still holds every trace of the session).",
            summary_table(pd.DataFrame()), summary_table(pd.DataFrame(), by_prompt=True), [])


def _ci(value: float, lo: float, hi: float, scale: float = 1.0, fmt: str = "{:.0f}") -> str:
    if value is None or not np.isfinite(value):
        return "–"
    text = fmt.format(value * scale)
    if np.isfinite(lo) and np.isfinite(hi):
        text += f" [{fmt.format(lo * scale)}–{fmt.format(hi * scale)}]"
    return text


def summary_table(summary: pd.DataFrame, by_prompt: bool = False) -> pd.DataFrame:
    """The grouped summary as a compact table of strings: one 'setup' column, every number with its
    95% interval in brackets, a ⚠ under 5 samples."""
    columns = ["setup", *(["prompt"] if by_prompt else []), "n", "speedup vs AR", "acceptance", "latency p50 ms",
               *([] if by_prompt else ["p95 ms", "p99 ms"]), "TTFT p50 ms"]  # what a decision needs first
    if summary.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for r in summary.to_dict("records"):
        # every option of the setup (decoding/config.setup_label), so two rows never read alike
        row = {"setup": f"{r['method']} · {r['setup']} · preset {r['preset']}"}
        if by_prompt:
            row["prompt"] = short_text(r["prompt"], 32)
        row["n"] = f"{r['n']} ⚠" if r["warning"] else str(r["n"])
        for q in (50,) if by_prompt else (50, 95, 99):
            key = "latency p50 ms" if q == 50 else f"p{q} ms"
            row[key] = _ci(r[f"latency_p{q}_s"], r[f"latency_p{q}_lo"], r[f"latency_p{q}_hi"], 1e3)
        row["TTFT p50 ms"] = _ci(r["ttft_p50_s"], r["ttft_p50_lo"], r["ttft_p50_hi"], 1e3)
        row["acceptance"] = _ci(r["acceptance_mean"], r["acceptance_lo"], r["acceptance_hi"], 100, "{:.0f}") \
            .replace("]", "]%") if np.isfinite(r["acceptance_mean"]) else "–"
        if r["speedup_note"] and not np.isfinite(r["speedup_lo"]) and r["method"] != "autoregressive":
            row["speedup vs AR"] = r["speedup_note"]
        elif r["method"] == "autoregressive":
            row["speedup vs AR"] = "1 (reference)"
        else:
            row["speedup vs AR"] = _ci(r["speedup"], r["speedup_lo"], r["speedup_hi"], 1, "{:.2f}") + "×"
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def read_uploaded_prompts(path: str) -> list[Prompt]:
    """The uploaded file through workload's parser (one prompt a line, or JSONL with "prompt" and an
    optional "temperature"), within the app's bounds on bytes and prompts."""
    size = Path(path).stat().st_size
    if size > MAX_PROMPT_FILE_BYTES:
        raise gr.Error(f"the prompt file is {size / 1000:.0f} kB; the limit is {MAX_PROMPT_FILE_BYTES // 1000} kB",
                       print_exception=False)
    try:
        prompts = parse_prompts(read_prompt_text(Path(path)), Path(path).name)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    if len(prompts) > MAX_PROMPTS:
        raise gr.Error(f"the prompt file holds {len(prompts)} prompts; the limit is {MAX_PROMPTS}",
                       print_exception=False)
    return prompts


def export_traces(history: list[Trace] | None) -> list[str]:
    """Write every trace of the session: CSV (one row per request, with its prompt and every setting) and
    JSON (every event)."""
    if not history:
        raise gr.Error("no traces yet: run something first", print_exception=False)
    folder = Path(tempfile.mkdtemp(prefix="explorer-traces-"))
    csv_path, json_path = folder / "traces.csv", folder / "traces.json"
    requests_frame(history).to_csv(csv_path, index=False)
    json_path.write_text(json.dumps([t.to_dict() for t in history]), encoding="utf-8")
    return [str(csv_path), str(json_path)]
