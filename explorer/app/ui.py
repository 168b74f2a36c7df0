"""The Gradio page: Blocks layout and event wiring only; ``build_demo(default_preset=...)`` builds it.

Everything else lives beside it: the controls' values (lane_settings.Settings), the Run handler and its notes
(handlers), the measure tab (measure_tab), the engine tab (engine_tab, with its own layout: imported only where it
is shown), the two-phase playback and the race replay (playback), frames (render, narration, live_plots), figures
(plots), the page's prose, style and scripts (page, text/*.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from explorer.app import hosting, plots
from explorer.app.audit_tab import AUDIT_MAX_SAMPLES, run_audit_tab
from explorer.app.controls import build_settings
from explorer.app.decide_tab import build_decide_tab
from explorer.app.handlers import (
    HISTORY_LIMIT,
    LONG_PROMPT_TOKENS,
    RUN_OUTPUTS,
    RUN_TABLE_COLUMNS,
    RUN_TABLE_WIDTHS,
    acceptance_note,
    run_lanes,
    show_run,
    why_text,
)
from explorer.app.lane_settings import (
    PRESET_CONTROLS,
    SETTING_NAMES,
    Settings,
    describe_preset,
)
from explorer.app.measure_tab import (
    MAX_PROMPT_FILE_BYTES,
    MAX_PROMPTS,
    MAX_REPEATS,
    clear_measured,
    export_traces,
    measure,
    summary_table,
)
from explorer.app.page import (
    EXAMPLE_LABELS,
    EXAMPLES,
    LOAD_JS,
    PAGE_CSS,
    PRESENTER_JS,
    SCROLL_JS,
    SETTLE_JS,
    STYLE,
    read_text,
)
from explorer.app.playback import LIVE, initial_frame, preview_frame, replay_at, replay_play, replay_step
from explorer.app.runs import HISTORY_COLUMNS, HISTORY_WIDTHS, RUNS_LIMIT, compare_figure
from explorer.app.turns import taking_turn
from explorer.decoding.prompting import MAX_PROMPT_CHARS
from explorer.models import DEFAULT_PRESET

SPEEDS = [("live: all lanes decode at once, shown as they go (they share the CPU)", LIVE),
          ("timed: each lane alone, then all replayed, about 4 s", 0.0), ("timed, replayed in real time", 1.0),
          ("timed, replayed 2× slower", 2.0), ("timed, replayed 10× slower", 10.0),
          ("timed, replayed 100× slower", 100.0)]


# ----------------------------------------------------------------------------------------------
# layout

@dataclass
class Controls:
    """The components the event wiring needs (filled in by the builders)."""

    prompt: Any = None
    preset: Any = None
    lanes: Any = None
    audit_temperature: Any = None
    audit_top_k: Any = None
    audit_gamma: Any = None
    audit_run: Any = None
    audit_out: Any = None
    settings: list[Any] = None  # in Settings field order
    speed: Any = None
    presenter: Any = None
    sidebar: Any = None
    run: Any = None
    stop: Any = None
    model_info: Any = None
    frame: Any = None
    run_table: Any = None
    result: Any = None
    figures: list[Any] = None  # in plots.FIGURE_KEYS order
    break_even: Any = None  # beside the run table, not in the Plots tab
    plots_note: Any = None
    acceptance_note: Any = None
    why: Any = None
    history: Any = None
    current: Any = None
    scrubber: Any = None
    play: Any = None
    pause: Any = None
    back: Any = None
    forward: Any = None
    repeats: Any = None
    prompt_file: Any = None
    measure_prompt: Any = None
    measure_file: Any = None
    measure_status: Any = None
    summary: Any = None
    per_prompt: Any = None
    measure_figures: list[Any] = None
    export: Any = None
    files: Any = None
    runs: Any = None  # gr.State: this page's runs (runs.py)
    measured: Any = None  # gr.State: the measure tab's batches since Clear
    measure_clear: Any = None
    runs_table: Any = None
    show_run: Any = None
    compare: Any = None
    compare_plot: Any = None


def _build_prompt(c: Controls) -> None:
    with gr.Row(equal_height=False, elem_id="prompt-row"):
        c.prompt = gr.Textbox(label="Prompt", lines=2, max_lines=12, max_length=MAX_PROMPT_CHARS, elem_id="prompt",
                              value=EXAMPLES[0][0], scale=5,
                              info=f"at most {MAX_PROMPT_CHARS:,} characters (longer text is cut there); a prompt over "
                                   f"{LONG_PROMPT_TOKENS} tokens is timed first: the lanes say what reading it costs "
                                   "here, and one this machine cannot read within 30 s is refused with the length "
                                   "that fits")
        with gr.Column(scale=1, min_width=150, elem_id="run-column"):
            c.run = gr.Button("▶ Run", variant="primary", elem_id="run")
            c.stop = gr.Button("■ Stop", variant="stop", elem_id="stop")
            c.presenter = gr.Checkbox(False, label="Presenter mode", elem_id="presenter",
                                      info="large type, sidebar closed")


def _build_examples(c: Controls) -> None:
    drafter, temperature = c.settings[SETTING_NAMES.index("drafter")], c.settings[SETTING_NAMES.index("temperature")]
    with gr.Accordion("Examples (each shows a different regime)", open=False, elem_id="examples"):
        gr.Examples(EXAMPLES, inputs=[c.prompt, drafter, temperature], example_labels=EXAMPLE_LABELS, label=None)


def _build_lanes(c: Controls) -> None:
    c.frame = gr.HTML(initial_frame(), css_template=STYLE, apply_default_css=False, js_on_load=None,
                      elem_id="lanes")
    with gr.Group(elem_id="replay"), gr.Row(equal_height=True):
        with gr.Column(scale=1, min_width=260):
            gr.Markdown("**Race replay**: the finished run again, on one shared clock; no model runs.")
            with gr.Row():
                c.play = gr.Button("▶ Play", size="sm", elem_id="replay-play", min_width=60)
                c.pause = gr.Button("❙❙ Pause", size="sm", elem_id="replay-pause", min_width=60)
                c.back = gr.Button("◀ Step", size="sm", elem_id="replay-back", min_width=60)
                c.forward = gr.Button("Step ▶", size="sm", elem_id="replay-forward", min_width=60)
        c.scrubber = gr.Slider(0, 1, value=0, step=0.01, label="replay time (ms, shared clock; type a time or drag)",
                               elem_id="scrubber", scale=2)
    c.model_info = gr.Markdown("Loading the default preset …", elem_id="model-info")
    with gr.Accordion("Why? Five questions a student asks", open=False, elem_id="why-panel"):
        c.why = gr.Markdown(why_text(), elem_id="why")
    c.run_table = gr.Dataframe(pd.DataFrame(columns=RUN_TABLE_COLUMNS), elem_id="run-table", interactive=False,
                               label="This run, one row per lane (press Run to fill it)", wrap=True,
                               column_widths=RUN_TABLE_WIDTHS)
    with gr.Row(equal_height=False, elem_id="break-even-row"):  # the run's speedup against its prediction
        c.break_even = gr.Plot(plots.all_figures([], {})["break_even"], label="break even", scale=3, min_width=480,
                               elem_classes=["explorer-plot"], elem_id="plot-break_even")
        c.acceptance_note = gr.Markdown(acceptance_note(None), elem_id="acceptance-note", scale=2, min_width=280)
    with gr.Accordion(f"Run history: every run of this page (the last {RUNS_LIMIT}), to compare", open=True,
                      elem_id="history-panel"):
        c.runs_table = gr.Dataframe(pd.DataFrame(columns=HISTORY_COLUMNS), elem_id="run-history", interactive=False,
                                    wrap=True, column_widths=HISTORY_WIDTHS,
                                    label="Runs, newest first (speedups: median and range once several runs share "
                                          "a setup)")
        with gr.Row():
            c.show_run = gr.Dropdown([], label="Show an earlier run's lanes (no model runs)", elem_id="show-run")
            c.compare = gr.Dropdown([], multiselect=True, label="Compare runs: acceptance side by side",
                                    elem_id="compare-runs")
        c.compare_plot = gr.Plot(compare_figure([], []), label="compare runs", elem_id="plot-compare",
                                 elem_classes=["explorer-plot"])


def _build_plots(c: Controls) -> None:
    c.plots_note = gr.Markdown("Plots appear as the lanes play: press Run.", elem_id="plots-note")
    empty = plots.all_figures([], {})
    c.figures = []
    keys = [k for k in plots.FIGURE_KEYS if k != "break_even"]  # that one sits beside the run table
    for left, right in zip(keys[::2], keys[1::2], strict=True):
        with gr.Row():
            for key in (left, right):
                c.figures.append(gr.Plot(empty[key], label=key.replace("_", " "), elem_classes=["explorer-plot"],
                                         elem_id=f"plot-{key}"))
    c.figures.insert(plots.FIGURE_KEYS.index("break_even"), c.break_even)
    with gr.Accordion("Token ids, text and stats per lane (what the /run API returns last)", open=False):
        c.result = gr.JSON(label="Last run")


def _build_measure(c: Controls) -> None:
    gr.Markdown("Percentiles need many requests. Run the prompt above R times per lane (seed + i for repeat i), "
                f"or upload your own traffic: a `.txt` file with one prompt a line or `.jsonl` with a "
                f"`\"prompt\"` field and optionally `\"temperature\"` (at most {MAX_PROMPTS} prompts, "
                f"{MAX_PROMPT_FILE_BYTES // 1000} kB). Every decode runs alone; nothing is animated. Results are "
                "grouped by preset, method, drafter, γ, temperature and diffusion schedule, never pooled across "
                "them; every number has its 95% bootstrap interval in brackets.")
    with gr.Row():
        c.repeats = gr.Slider(1, MAX_REPEATS, value=5, step=1, label="R (repeats per prompt and lane)",
                              elem_id="measure-repeats")
        c.measure_prompt = gr.Button("Run this prompt R times", elem_id="measure-prompt")
    with gr.Row():
        c.prompt_file = gr.File(label="Prompt file (.txt / .jsonl)", file_types=[".txt", ".jsonl"], type="filepath")
        c.measure_file = gr.Button("Run the workload", elem_id="measure-file")
    with gr.Row():
        c.measure_status = gr.Markdown("Nothing measured yet: the tables fill after a measurement and keep every "
                                       "batch (γ 2, then γ 4, ...) until Clear.", elem_id="measure-status")
        c.measure_clear = gr.Button("Clear the tables", size="sm", scale=0, elem_id="measure-clear")
    c.summary = gr.Dataframe(summary_table(pd.DataFrame()), label="Per setup (never pooled)", interactive=False,
                             wrap=True, elem_id="summary")
    c.per_prompt = gr.Dataframe(summary_table(pd.DataFrame(), by_prompt=True), label="Per prompt", interactive=False,
                                wrap=True, elem_id="per-prompt")
    empty = plots.all_figures([], {})
    with gr.Row():
        c.measure_figures = [gr.Plot(empty["latency_percentiles"], label="Latency p50/p95/p99"),
                             gr.Plot(empty["latency_cdf"], label="Latency CDF")]
    with gr.Row():
        c.export = gr.Button("Export every trace of this session (CSV + JSON)")
        c.files = gr.File(label="Traces", file_count="multiple", interactive=False)
    gr.Markdown(f"The export holds every request of this session (up to {HISTORY_LIMIT}; older ones are dropped and "
                "the status line says so), one CSV row each with its prompt and every setting.")


def _build_audit(c: Controls) -> None:
    gr.Markdown("Samples the speculative decoder's first tokens on the prompt above and tests them against the "
                "target's exact distribution (enumerated from p), with the power to see the known sampler bugs "
                "*here*: the same verdict as `python -m explorer audit` (PASS / FAIL / INCONCLUSIVE). "
                f"At most {AUDIT_MAX_SAMPLES} samples per request.")
    with gr.Row():
        c.audit_temperature = gr.Slider(0, 2, value=1.0, step=0.05, label="temperature",
                                        info="0 = greedy: no known bug changes a greedy output, so the audit "
                                             "there is vacuous (never PASS)", elem_id="audit-temperature")
        c.audit_top_k = gr.Slider(1, 64, value=8, step=1, label="top-k (makes the first token enumerable)")
        c.audit_gamma = gr.Slider(1, 8, value=3, step=1, label="γ")
    c.audit_run = gr.Button("Run the audit", elem_id="audit-run")
    c.audit_out = gr.Markdown("No audit yet.", elem_id="audit-out")


def build_demo(default_preset: str = DEFAULT_PRESET) -> gr.Blocks:
    """The whole app, opening on ``default_preset``; ``app.py`` exposes it as the module-level ``demo``."""
    c = Controls()
    with gr.Blocks(title="Decoding explorer", fill_width=True) as demo:
        gr.HTML(f"<style>{PAGE_CSS}</style>", apply_default_css=False, padding=False, elem_id="page-style")
        gr.Markdown(read_text("intro.md"), elem_id="intro")
        c.history, c.current, c.runs, c.measured = gr.State([]), gr.State(None), gr.State([]), gr.State([])
        with gr.Sidebar(label="Settings", width=330, elem_id="sidebar") as c.sidebar:
            c.settings = build_settings(c, default_preset, SPEEDS, LIVE)
        _build_prompt(c)
        _build_examples(c)
        _build_lanes(c)
        with gr.Tabs():
            with gr.Tab("Plots"):
                _build_plots(c)
            with gr.Tab("Measure: percentiles and workloads"):
                _build_measure(c)
            if not hosting.on_space():  # a public Space must not fetch URLs its visitors type
                from explorer.app.engine_tab import build_engine_tab  # deferred: openai (~0.5 s) via app.engine_tab

                with gr.Tab("Engine: a live vLLM server"):
                    build_engine_tab(demo, c.speed)
            with gr.Tab("How it works"):
                gr.Markdown(read_text("how_it_works.md"),
                            latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                              {"left": "$", "right": "$", "display": False}])
            with gr.Tab("Audit: is it lossless?"):
                _build_audit(c)
            with gr.Tab("Deployment checklist"):
                build_decide_tab(c.preset)
        _wire(c, demo)
    return demo.queue(max_size=32, default_concurrency_limit=1)


def with_settings(fn: Callable[..., Iterator], before: int) -> Callable[..., Iterator]:
    """Gradio passes one value per input; ``fn`` takes one Settings after its first ``before`` arguments."""
    n = len(SETTING_NAMES)

    def handler(*values: Any) -> Iterator:
        yield from fn(*values[:before], Settings.from_values(values[before:before + n]), *values[before + n:])

    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


def _wire(c: Controls, demo: gr.Blocks) -> None:
    """Events. Decodes never compete for the cores: Run waits in turns.DECODES (its lanes say how many are ahead),
    Measure, Audit and preset loads share one Gradio concurrency slot and take the same turn."""
    decode_slot = {"concurrency_id": "decode", "concurrency_limit": 1}
    outputs = {"frame": c.frame, "run_table": c.run_table, "result": c.result, "model_info": c.model_info,
               **dict(zip(plots.FIGURE_KEYS, c.figures, strict=True)), "plots_note": c.plots_note,
               "acceptance_note": c.acceptance_note, "why": c.why, "history": c.history, "current": c.current,
               "scrubber": c.scrubber, "runs": c.runs, "runs_table": c.runs_table, "show_run": c.show_run,
               "compare": c.compare, "compare_plot": c.compare_plot}
    c.run.click(None, js=SCROLL_JS)
    preview = {"fn": preview_frame, "inputs": [c.current, c.lanes, *c.settings], "outputs": c.frame,
               "api_visibility": "undocumented", "show_progress": "hidden", "queue": False}
    for control in (c.lanes, *c.settings):  # the waiting lanes' headers follow the controls
        control.change(**preview)
    run_inputs = [c.prompt, c.preset, c.lanes, *c.settings, c.speed, c.history, c.runs]
    run = c.run.click(with_settings(run_lanes, 3), run_inputs,
                      [outputs[name] for name in RUN_OUTPUTS], api_name="run", show_progress="hidden",
                      concurrency_id="run", concurrency_limit=16)
    batch_inputs = [c.prompt, c.prompt_file, c.repeats, c.preset, c.lanes, *c.settings, c.history, c.measured]
    batch_outputs = [c.measure_status, c.summary, c.per_prompt, *c.measure_figures, c.history,
                     outputs["latency_percentiles"], outputs["latency_cdf"], c.measured]
    batch = {"outputs": batch_outputs, "show_progress_on": c.measure_status, **decode_slot}
    measuring = taking_turn(with_settings(measure, 6), "measurement")
    by_prompt = c.measure_prompt.click(measuring, [gr.State("prompt"), *batch_inputs], api_name="measure", **batch)
    by_file = c.measure_file.click(measuring, [gr.State("file"), *batch_inputs], api_name="workload", **batch)
    c.measure_clear.click(clear_measured, None, [c.measure_status, c.summary, c.per_prompt, c.measured],
                          api_visibility="undocumented", queue=False)
    audit_inputs = [c.prompt, c.preset, c.audit_temperature, c.audit_top_k, c.audit_gamma]
    c.audit_run.click(taking_turn(run_audit_tab, "audit"), audit_inputs, c.audit_out, api_name="audit",
                      show_progress_on=c.audit_out, **decode_slot)
    play = c.play.click(replay_play, [c.current, c.scrubber, c.speed], [c.frame, c.scrubber],
                        api_visibility="undocumented", concurrency_limit=8, show_progress="hidden")
    c.pause.click(None, js=SETTLE_JS, cancels=[play])
    c.stop.click(None, js=SETTLE_JS, cancels=[run, by_prompt, by_file, play])
    step = {"outputs": [c.frame, c.scrubber], "api_visibility": "undocumented", "show_progress": "hidden"}
    c.forward.click(lambda cur, at: replay_step(cur, at), [c.current, c.scrubber], cancels=[play], **step)
    c.back.click(lambda cur, at: replay_step(cur, at, True), [c.current, c.scrubber], cancels=[play], **step)
    scrub = {"outputs": c.frame, "api_visibility": "undocumented", "show_progress": "hidden"}
    c.scrubber.release(replay_at, [c.current, c.scrubber], **scrub)
    c.scrubber.input(replay_at, [c.current, c.scrubber], trigger_mode="always_last", **scrub)
    c.show_run.input(show_run, [c.runs, c.show_run], [c.frame, c.current, c.run_table, c.scrubber], cancels=[play],
                     api_visibility="undocumented", show_progress="hidden")
    c.compare.input(compare_figure, [c.runs, c.compare], c.compare_plot, api_visibility="undocumented",
                    show_progress="hidden")
    c.export.click(export_traces, c.history, c.files, api_name="export", api_visibility="undocumented")
    c.presenter.change(lambda on: gr.Sidebar(open=not on), c.presenter, c.sidebar, js=PRESENTER_JS,
                       api_visibility="undocumented", queue=False)
    follows = [c.model_info] + [c.settings[SETTING_NAMES.index(n)] for n in PRESET_CONTROLS]
    describe = taking_turn(describe_preset, "preset load")  # a load never runs beside a decode
    # the waiting lanes' headers follow the preset's values too (an update from a handler fires no .change here)
    c.preset.change(describe, c.preset, follows, api_visibility="undocumented", **decode_slot).then(**preview)
    demo.load(describe, c.preset, follows, api_visibility="undocumented", **decode_slot).then(**preview)
    demo.load(None, js=LOAD_JS)


