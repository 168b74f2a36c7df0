"""The "Deployment checklist" tab: the checklist filled in from the visitor's own prompts (``explorer decide``)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from explorer.app.lane_settings import load_preset
from explorer.app.page import read_text
from explorer.app.plots import style_figure
from explorer.errors import ExplorerError
from explorer.measure.decide import DecideSettings, batch_sentence
from explorer.measure.decide_cli import clean, decide, sections
from explorer.measure.progress import LISTENER
from explorer.measure.report import frontier_figure as report_frontier_figure
from explorer.measure.report import write_report
from explorer.measure.workload import PromptSet, parse_prompts, read_prompt_text

MAX_PROMPTS, MAX_NEW_TOKENS = 24, 64  # a request of the page's: bounded so that one visitor cannot hold the server
EXAMPLE = "\n".join([
    '{"prompt": "Write a Python function that reverses a string.", "category": "code"}',
    '{"prompt": "Write a Python function that checks whether a number is prime.", "category": "code"}',
    '{"prompt": "Write a Python function that merges two sorted lists.", "category": "code"}',
    '{"prompt": "Explain photosynthesis in simple terms.", "category": "prose"}',
    '{"prompt": "Tell me about the water cycle.", "category": "prose"}',
    '{"prompt": "Give me three facts about honeybees.", "category": "prose"}'])


GROUP_COLUMNS = ["Group", "Requests", "Acceptance", "Tokens per target pass", "Speedup vs autoregressive", "Verdict"]
TAIL_COLUMNS = ["Group", "Method", "Metric", "n", "Mean (ms)", "p50 (ms)", "p95 (ms)", "p99 (ms) [95% interval]"]
MEMORY_COLUMNS = ["Context", "Tokens", "Drafter", "Drafter weights", "Drafter KV cache", "Target weights",
                  "Target KV cache", "Drafter's share", "How it was measured"]
DIFFUSION_COLUMNS = ["Setting", "N", "Tokens per pass", "Perplexity, median (autoregressive)",
                     "Repeated words (autoregressive)", "Distinct 3-grams (autoregressive)", "Quality holds",
                     "Speedup vs autoregressive", "Beats autoregressive", "Requests"]


def sig(x, digits: int = 3) -> str:
    """A number for people: ``digits`` significant digits (integers as they are), '–' for a missing one."""
    if x is None or isinstance(x, float) and not math.isfinite(x):
        return "–"
    if isinstance(x, int) or float(x).is_integer() and abs(x) >= 10 ** (digits - 1):
        return f"{int(round(x)):,}"
    return f"{float(f'{x:.{digits}g}'):g}"


def interval(x, lo, hi, unit: str = "", scale: float = 1.0) -> str:
    """'1.49x [1.17–1.86]'; without a finite interval, the value alone."""
    if x is None or not math.isfinite(x):
        return "–"
    text = f"{sig(x * scale)}{unit}"
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        text += f" [{sig(lo * scale)}–{sig(hi * scale)}]"
    return text


def mib(n) -> str:
    return "–" if n is None else f"{sig(n / 2**20)} MiB"


def groups_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[r["group"], r["requests"], interval(r["acceptance"], r["acceptance_lo"], r["acceptance_hi"],
                                                               "%", 100),
                          sig(r["tokens_per_pass"]), interval(r["speedup"], r["speedup_lo"], r["speedup_hi"], "x"),
                          r["verdict"]] for r in rows], columns=GROUP_COLUMNS)


def tail_table(rows: list[dict]) -> tuple[pd.DataFrame, str]:
    """The tail as a table, and a caption for the cell that surprises: speculative inter-token p50 of 0 ms."""
    table = pd.DataFrame([[r["group"], r["method"], r["metric"], r["n"], sig(r["mean_ms"]), sig(r["p50_ms"]),
                           sig(r["p95_ms"]), interval(r["p99_ms"], r["p99_lo_ms"], r["p99_hi_ms"])] for r in rows],
                         columns=TAIL_COLUMNS)
    zero = any(r["method"] == "speculative" and r["metric"] == "inter-token latency" and r["p50_ms"] == 0
               for r in rows)
    caption = ("Speculative decoding's inter-token p50 of 0 ms is real: the tokens a verify pass accepts arrive "
               "together, so most gaps between them are zero; the pass times show in its p95 and p99.") if zero else ""
    return table, caption


def percent(x) -> str:
    """A share as a percentage with 2 significant digits; '–' for a missing one."""
    return "–" if x is None or isinstance(x, float) and not math.isfinite(x) else f"{sig(100 * x, 2)}%"


def memory_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[r["context"], r["tokens"], r["drafter"], mib(r["drafter_weights_bytes"]),
                          mib(r["drafter_kv_bytes"]), mib(r["target_weights_bytes"]), mib(r["target_kv_bytes"]),
                          f"{sig(100 * r['drafter_share'], 2)}%", r["how"]] for r in rows], columns=MEMORY_COLUMNS)


def diffusion_table(rows: list[dict]) -> pd.DataFrame:
    def beside(key: str, show=sig) -> object:
        return lambda r: f"{show(r.get(key))} ({show(r.get('ar_' + key))})"

    cells = [lambda r: r["config"], lambda r: r["N"], lambda r: sig(r.get("tokens_per_pass")),
             beside("median_perplexity"), beside("repeat_rate", percent), beside("distinct_3"),
             lambda r: "yes" if r["quality_holds"] else "no",
             lambda r: interval(r["speedup_vs_ar"], r["speedup_lo"], r["speedup_hi"], "x"),
             lambda r: "yes" if r["beats_ar"] else "no", lambda r: r["requests"]]
    return pd.DataFrame([[cell(r) for cell in cells] for r in rows], columns=DIFFUSION_COLUMNS)


def frontier_figure(rows: list[dict]) -> go.Figure:
    """The report's frontier plot (measure.report.frontier_figure), styled for the page."""
    caption = ("Each diffusion setting on your prompts: to the right commits more tokens per denoiser pass, higher "
               "repeats words more; the dashed line is the target's own rate." if rows else
               "Tick 'Also find where diffusion's quality holds' to measure the diffusion settings.")
    fig = report_frontier_figure(rows)  # its axis titles stay; the page's title, caption and legend replace the rest
    fig = style_figure(fig, fig.layout.title.text, caption)
    return fig.update_layout(legend={"orientation": "v", "x": 1.02, "y": 1, "yanchor": "top"},
                             margin={"r": 260})


def tables(result: dict) -> tuple[list[str], tuple]:
    """Every table of the decision for people; a part that cannot be shown becomes an error line, the rest shows."""
    errors, out = [], []
    for name, make, columns in (("groups", groups_table, GROUP_COLUMNS), ("tail", tail_table, TAIL_COLUMNS),
                                ("memory", memory_table, MEMORY_COLUMNS),
                                ("diffusion", diffusion_table, DIFFUSION_COLUMNS)):
        try:
            made = make(result.get(name) or [])
        except Exception as exc:  # noqa: BLE001 - one part's failure is one visible line, never empty tables
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            made = pd.DataFrame(columns=columns)
        out.append(made)
    tail, caption = out[1] if isinstance(out[1], tuple) else (out[1], "")
    return errors, (out[0], tail, caption, out[2], out[3])


def decide_tab(preset: str, text: str, upload: str | None, temperatures: str, max_new: int, diffusion: bool,
               progress: gr.Progress = gr.Progress()):  # noqa: B008
    """Decode the prompts (AR and speculative, interleaved), fill in the checklist, return its tables and files.
    Bad input is one gr.Error; a part of the checklist that fails is one error line, and the rest is shown."""
    try:
        source = read_prompt_text(Path(upload)) if upload else text
        if not (source or "").strip():
            raise ExplorerError("paste prompts (one a line, or JSONL with \"prompt\" and \"category\") "
                                "or upload a file")
        prompts = parse_prompts(source, "the prompts")
        if len(prompts) > MAX_PROMPTS:
            raise ExplorerError(f"{len(prompts)} prompts; the page decides on at most {MAX_PROMPTS} (use "
                                "`python -m explorer decide` for more)")
        try:
            temps = tuple(float(t) for t in (temperatures or "0").split(",") if t.strip())
        except ValueError:
            raise ExplorerError(f"temperatures: comma-separated numbers such as 0,1 (got {temperatures!r})") from None
        if not temps or any(t < 0 for t in temps) or len(temps) > 3:
            raise ExplorerError("temperatures: one to three numbers >= 0")
        s = DecideSettings(max_new_tokens=int(max_new), temperatures=temps, progress=False,
                           diffusion_divisors=DecideSettings.diffusion_divisors if diffusion else ())
        models = load_preset(preset, progress)

        def said(done: int, total: int, what: str, left: float | None) -> None:  # the line under the verdicts
            progress((done, total), desc=what + ("" if left is None else f", about {left:.0f} s left"), unit="steps")

        listening = LISTENER.set(said)
        try:
            result = decide(models, [PromptSet("your prompts", "the page", tuple(prompts))], s)
        finally:
            LISTENER.reset(listening)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except Exception as exc:  # noqa: BLE001 - the page keeps serving and says what failed
        line = f"- error: the checklist could not be measured ({type(exc).__name__}: {exc})"
        empty = (pd.DataFrame(columns=GROUP_COLUMNS), pd.DataFrame(columns=TAIL_COLUMNS),
                 pd.DataFrame(columns=MEMORY_COLUMNS), pd.DataFrame(columns=DIFFUSION_COLUMNS))
        return (line, *empty, frontier_figure([]), None)
    problems, (groups, tail, caption, memory, diff) = tables(result)
    out = Path(tempfile.mkdtemp(prefix="decide-"))
    files = []
    try:
        (out / "decision.json").write_text(json.dumps(clean(result), indent=2, allow_nan=False))
        write_report(out / "decision.html", result["header"], sections(result),
                     title="Decoding explorer: the decision")
        files = [str(out / "decision.json"), str(out / "decision.html")]
    except Exception as exc:  # noqa: BLE001
        problems.append(f"files: {type(exc).__name__}: {exc}")
    lines = [f"- {line}" for line in result.get("verdicts", [])]
    lines += [f"- error: {e}" for e in [*result.get("errors", []), *problems]]
    batch = result.get("batch") or {}
    if batch:
        lines.append(f"- {batch_sentence(batch)}")
    if caption:
        lines.append(f"- note on the tail: {caption}")
    if not lines:
        lines = ["- error: the checklist returned nothing to show"]
    return ("\n".join(lines), groups, tail, memory, diff, frontier_figure(result.get("diffusion") or []), files)


def build_decide_tab(preset: gr.components.Component) -> None:
    with gr.Accordion("The checklist", open=False):
        gr.Markdown(read_text("checklist.md"))
    gr.Markdown("Paste or upload your own prompts: each is decoded with and without speculation, one request at a "
                f"time, and every item of the checklist is answered from them (at most {MAX_PROMPTS} prompts here; "
                "`python -m explorer decide` has no such limit and can measure a live engine's batch effect).")
    with gr.Row():
        text = gr.Textbox(EXAMPLE, lines=6, max_lines=12, label="Prompts (one a line, or JSONL with a category)",
                          elem_id="decide-prompts", scale=3)
        with gr.Column(scale=1, min_width=220):
            upload = gr.File(label="or a prompt file", file_types=[".txt", ".jsonl"], type="filepath")
            temperatures = gr.Textbox("0", label="Temperatures (comma-separated)")
            max_new = gr.Slider(8, MAX_NEW_TOKENS, value=32, step=8, label="New tokens per request (N)")
            diffusion = gr.Checkbox(True, label="Also find where diffusion's quality holds")
            decide_button = gr.Button("Decide on these prompts", variant="primary", elem_id="decide-run")
    verdicts = gr.Markdown(elem_id="decide-verdicts")
    groups = gr.Dataframe(label="1. Acceptance and speedup by group (95% bootstrap intervals)",
                          wrap=True, elem_id="decide-groups")
    tail = gr.Dataframe(label="2. The tail: request and inter-token latency percentiles (ms)",
                        wrap=True, elem_id="decide-tail")
    memory = gr.Dataframe(label="4. The drafter's memory at your lengths (measured)",
                          wrap=True, elem_id="decide-memory")
    diff = gr.Dataframe(label="6. Diffusion: the K or sampler where quality holds",
                        wrap=True, elem_id="decide-diff")
    frontier = gr.Plot(frontier_figure([]), label="Diffusion: tokens per pass against repeated words",
                       elem_id="decide-frontier")
    files = gr.Files(label="The decision as JSON and HTML")
    decide_button.click(decide_tab, [preset, text, upload, temperatures, max_new, diffusion],
             [verdicts, groups, tail, memory, diff, frontier, files], api_name="decide", concurrency_id="decode",
             concurrency_limit=1, show_progress_on=verdicts)
