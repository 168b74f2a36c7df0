"""The Gradio app: Blocks wiring only (frames come from render.py, figures from plots.py).

Lanes run one after another, each decoder alone in a worker thread that never waits for the UI
(DESIGN.md: "measured exclusively"); the UI then plays back the recorded events at up to 20
frames per second (a slow decode also gets a few live frames while it runs). The race replay
re-animates the finished traces on a shared clock without running a model again. Handlers are
plain functions so tests can call them directly.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

import explorer
from explorer import plots, render
from explorer.api import make_config
from explorer.config import validate_prompt
from explorer.errors import ExplorerError
from explorer.events import Event, Proposal, Trace, Verification
from explorer.metrics import requests_frame, summarize
from explorer.models import DEFAULT_PRESET, PRESETS, Models
from explorer.workload import Prompt, parse_prompts
from explorer.workload import read_prompt_file as read_text_file

try:  # Hugging Face ZeroGPU: ask for a GPU while a decoding handler runs
    import spaces

    gpu = spaces.GPU
except ImportError:  # anywhere else a no-op

    def gpu(fn):
        return fn


METHODS = ("autoregressive", "speculative", "diffusion")
STYLE = (Path(__file__).resolve().parent.parent / "assets" / "style.css").read_text(encoding="utf-8")
HISTORY_LIMIT = 50  # traces kept per session
FRAME_INTERVAL_S = 1 / 20  # playback: at most 20 frames per second ...
PLAYBACK_FRAMES = 40  # ... and at most 40 frames (2 s) per lane
LIVE_AFTER_S = 0.5  # a decode still running after this also shows live frames ...
LIVE_FRAME_INTERVAL_S = 0.25  # ... at 4 per second
LANE_GAP_S = 0.1  # pause before each lane so streaming the last frame does not overlap the decode
MAX_PROMPTS, MAX_PROMPT_FILE_BYTES, MAX_REPEATS, MAX_BATCH_DECODES = 200, 100_000, 20, 600
FRAME_NOTE = ("Each lane is decoded alone, one after another, then played back from its recorded events; each "
              "clock is that decoder's own. The race replay puts them on one shared clock.")


# ----------------------------------------------------------------------------------------------
# settings and model loading

@dataclass(frozen=True)
class Settings:
    """The decoding controls, in the order of the UI inputs (after prompt, preset and lanes)."""

    max_new_tokens: int = 48
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    drafter: str = "model"
    gamma: int = 4
    adaptive_gamma: bool = False
    steps: int = 24
    block_length: int = 16
    remasking: str = "low_confidence"
    threshold: float = 0.0

    def options(self, method: str, seed_offset: int = 0) -> dict[str, Any]:
        """explorer.decode keyword options for ``method`` (0 means 'off' for block length and threshold)."""
        options: dict[str, Any] = {"max_new_tokens": int(self.max_new_tokens), "temperature": float(self.temperature),
                                   "top_p": None if self.top_p >= 1 else float(self.top_p),
                                   "seed": int(self.seed) + seed_offset}
        if method == "speculative":
            options.update(gamma=int(self.gamma), drafter=self.drafter, adaptive_gamma=bool(self.adaptive_gamma))
        if method == "diffusion":
            options.update(steps=int(self.steps) or None, block_length=int(self.block_length) or None,
                           remasking=self.remasking, threshold=float(self.threshold) or None)
        return options


SETTING_NAMES = [f.name for f in fields(Settings)]
_WARMED: set[int] = set()


def load_preset(preset: str, progress: gr.Progress | None = None) -> Models:
    """Load (cached) and warm up a preset; ExplorerError becomes one clear gr.Error."""
    if progress is not None:
        progress(0.05, desc=f"loading preset {preset} (first time only)")
    try:
        models = explorer.load_models(preset)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    if id(models) not in _WARMED:
        if progress is not None:
            progress(0.6, desc="warming up (the first pass of a model is slow; not measured)")
        _warm_up(models)
        _WARMED.add(id(models))
    return models


def _warm_up(models: Models) -> None:
    runs = [("autoregressive", {}), ("speculative", {"drafter": "model" if models.draft else "prompt_lookup"}),
            ("diffusion", {})]
    for method, extra in runs:
        with contextlib.suppress(ExplorerError):  # e.g. no diffusion model: that lane will say so when run
            explorer.decode(method, models, "def f(x):", max_new_tokens=4, **extra)


def describe_models(models: Models) -> str:
    """Markdown: preset, device, dtype, model names, weight memory (the draft's share)."""
    memory = models.memory_bytes()
    mem = ", ".join(f"{role} {size / 2**20:.1f} MiB" for role, size in memory.items())
    share = ""
    if "draft" in memory:
        share = f" (draft = {memory['draft'] / memory['target']:.0%} of the target's weights, plus its KV cache)"
    names = "; ".join(f"{role}: `{name}`" for role, name in models.names.items())
    return (f"**Preset `{models.preset.name}`** — {models.preset.description}  \n"
            f"Device **{models.device}**, dtype **{str(models.dtype).replace('torch.', '')}**, batch size 1. "
            f"Models: {names}.  \nWeights: {mem}{share}.")


def describe_preset(preset: str, progress: gr.Progress = gr.Progress()) -> str:  # noqa: B008 (Gradio idiom)
    return describe_models(load_preset(preset, progress))


def _tokenizer(models: Models, method: str) -> Any:
    return models.diffusion_tokenizer if method == "diffusion" else models.tokenizer


def _check_inputs(models: Models, prompt: str, lanes: list[str], settings: Settings) -> list[str]:
    """Validate every lane before any runs, so bad input gives one message and nothing half-done."""
    methods = [m for m in METHODS if m in (lanes or [])]
    try:
        if not methods:
            raise ExplorerError("choose at least one lane")
        validate_prompt(prompt)
        for method in methods:
            make_config(method, models, settings.options(method))
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    return methods


# ----------------------------------------------------------------------------------------------
# live animation

def _decode_worker(method: str, models: Models, prompt: str, options: dict[str, Any], out: queue.Queue,
                   origin: list[float], stop: threading.Event) -> None:
    """Run one decode as fast as it goes, handing each event to the UI through ``out``."""
    gen = explorer.stream(method, models, prompt, **options)
    origin.append(time.perf_counter())  # the lane's clock starts here
    try:
        while not stop.is_set():
            out.put(("event", next(gen)))
        gen.close()
        out.put(("stopped", None))
    except StopIteration as done:
        out.put(("trace", done.value))
    except Exception as exc:  # reported to the user by the UI thread
        out.put(("error", exc))


def animate_decode(method: str, models: Models, prompt: str, options: dict[str, Any],
                   stop: threading.Event | None = None) -> Iterator[tuple[list[Event], float, Trace | None]]:
    """Yield (events shown, decoder clock, trace on the last frame) for one lane.

    The decoder runs alone in a worker thread: the UI stays quiet for its first LIVE_AFTER_S,
    because rendering and streaming frames on the same cores would slow it (measured: +10% to
    +200% on 2 busy cores). A decode that finishes by then is played back from its recorded
    events; a longer one also gets a live frame every LIVE_FRAME_INTERVAL_S, which catches up a
    quarter of the backlog (no jumps), and the rest is played back once it has finished.
    """
    stop = stop or threading.Event()
    inbox: queue.Queue = queue.Queue()
    origin: list[float] = []
    worker = threading.Thread(target=_decode_worker, args=(method, models, prompt, options, inbox, origin, stop),
                              name=f"decode-{method}", daemon=True)
    worker.start()
    received: list[Event] = []
    try:
        trace, shown = _receive(inbox, received, time.perf_counter() + LIVE_AFTER_S), 0
        while trace is None:  # a slow decode: each live frame catches up a quarter of the backlog
            if len(received) > shown:
                shown = _frame_end(received, shown + math.ceil((len(received) - shown) / 4))
                yield received[:shown], received[shown - 1].t - origin[0], None
            trace = _receive(inbox, received, time.perf_counter() + LIVE_FRAME_INTERVAL_S)
        yield from _play_back(received, shown, trace, origin[0])
    finally:
        stop.set()


def _play_back(events: list[Event], shown: int, trace: Trace, origin: float) -> Iterator[tuple]:
    """The recorded events from ``shown`` on, in at most PLAYBACK_FRAMES frames at FRAME_INTERVAL_S."""
    size = max(1, math.ceil((len(events) - shown) / PLAYBACK_FRAMES))
    next_frame = time.perf_counter()
    while True:
        shown = _frame_end(events, shown + size)
        time.sleep(max(0.0, next_frame - time.perf_counter()))
        if shown >= len(events):
            yield events, trace.stats["wall_s"], trace
            return
        yield events[:shown], events[shown - 1].t - origin, None
        next_frame = time.perf_counter() + FRAME_INTERVAL_S


def _frame_end(events: list[Event], end: int) -> int:
    """End a frame on a fresh proposal when one follows, so pending drafts show next to the last verdicts."""
    end = min(end, len(events))
    if 0 < end < len(events) and isinstance(events[end - 1], Verification) and isinstance(events[end], Proposal):
        end += 1
    return end


def _receive(inbox: queue.Queue, received: list[Event], deadline: float) -> Trace | None:
    """Append the events that arrive before ``deadline``; return the Trace if the decode ended."""
    while True:
        try:
            kind, item = inbox.get(timeout=max(1e-4, deadline - time.perf_counter()))
        except queue.Empty:
            return None
        if kind == "event":
            received.append(item)
        elif kind == "trace":
            return item
        elif kind == "stopped":
            raise gr.Error("stopped", print_exception=False)
        else:
            message = str(item) if isinstance(item, ExplorerError) else f"{type(item).__name__}: {item}"
            raise gr.Error(message, print_exception=False)


def _lane_view(method: str, prompt: str, piece: render.Piece, options: dict[str, Any], events: list[Event],
               clock: float, status: str) -> render.LaneView:
    return render.LaneView(method, events, prompt, piece, options["max_new_tokens"], options.get("block_length"),
                           clock, status, render.lane_detail(method, options))


def _frame(views: dict[str, render.LaneView], caption: str = FRAME_NOTE) -> str:
    return render.lanes_html([render.lane_html(v) for v in views.values()], list(views), caption)


def initial_frame(methods: tuple[str, ...] = METHODS, settings: Settings = Settings()) -> str:
    """The lanes before any run: everything waiting, the diffusion canvas fully masked."""
    views = {m: _lane_view(m, "", str, settings.options(m), [], 0.0, "waiting") for m in methods}
    return _frame(views, "Press Run: the lanes will animate every draft/verify step and every refinement step.")


# ----------------------------------------------------------------------------------------------
# handlers

N_PLOTS = len(plots.FIGURE_KEYS)


@gpu
def run_lanes(prompt: str, preset: str, lanes: list[str], max_new_tokens: int, temperature: float, top_p: float,
              seed: int, drafter: str, gamma: int, adaptive_gamma: bool, steps: int, block_length: int,
              remasking: str, threshold: float, history: list[Trace] | None,
              progress: gr.Progress = gr.Progress()) -> Iterator[tuple]:  # noqa: B008
    """Animate every lane on one prompt, then return tables, figures, token ids and the replay state."""
    settings = Settings(max_new_tokens, temperature, top_p, seed, drafter, gamma, adaptive_gamma, steps,
                        block_length, remasking, threshold)
    models = load_preset(preset, progress)
    methods = _check_inputs(models, prompt, lanes, settings)
    options = {m: settings.options(m) for m in methods}
    pieces = {m: render.token_piece(_tokenizer(models, m)) for m in methods}
    views = {m: _lane_view(m, prompt, pieces[m], options[m], [], 0.0, "waiting") for m in methods}
    skip = (gr.skip(),) * (4 + N_PLOTS + 2)
    done: dict[str, Trace] = {}
    for method in methods:
        views[method] = _lane_view(method, prompt, pieces[method], options[method], [], 0.0, "running")
        yield (_frame(views), *skip)
        time.sleep(LANE_GAP_S)  # let that frame leave before the decoder starts, alone
        for events, clock, trace in animate_decode(method, models, prompt, options[method]):
            views[method] = _lane_view(method, prompt, pieces[method], options[method], events, clock,
                                       "done" if trace else "running")
            if trace:
                done[method] = trace
            yield (_frame(views), *skip)
    history = ([*(history or []), *done.values()])[-HISTORY_LIMIT:]
    figures = plots.all_figures(history, done, models.names)
    current = {"traces": done, "pieces": pieces}
    end_ms = max(t.stats["wall_s"] for t in done.values()) * 1e3
    yield (_frame(views, FRAME_NOTE + greedy_note(done)), run_table(done), token_result(done), describe_models(models),
           *(figures[k] for k in plots.FIGURE_KEYS), history, current,
           gr.Slider(minimum=0, maximum=round(end_ms + 0.1, 1), value=round(end_ms + 0.1, 1)))


def greedy_note(done: dict[str, Trace]) -> str:
    """At temperature 0 speculative output must equal autoregressive output (float32): say whether it did."""
    ar, spec = done.get("autoregressive"), done.get("speculative")
    if ar is None or spec is None or ar.config["temperature"] != 0:
        return ""
    dtype = spec.stats["dtype"]
    if ar.token_ids == spec.token_ids:
        return f" Greedy check: speculative output equals the autoregressive output token for token ({dtype})."
    first = next((i for i, (a, b) in enumerate(zip(ar.token_ids, spec.token_ids, strict=False)) if a != b),
                 min(len(ar.token_ids), len(spec.token_ids)))
    expected = "rounding differs in half precision" if dtype != "float32" else "unexpected in float32: a bug"
    return f" Greedy check: the outputs differ from token {first + 1} on ({dtype}: {expected})."


def token_result(done: dict[str, Trace]) -> dict[str, Any]:
    """What the API returns per lane: the token ids, the text and the stats."""
    return {m: {"token_ids": t.token_ids, "text": t.text, "stats": t.stats, "config": t.config}
            for m, t in done.items()}


def run_table(done: dict[str, Trace]) -> pd.DataFrame:
    """One row per lane of the last run, with the speedup against the autoregressive lane."""
    reference = done.get("autoregressive")
    rows = []
    for method, trace in done.items():
        s = trace.stats
        speedup = plots.measured_speedup(trace, reference) if reference is not None else float("nan")
        rows.append({"lane": method, "settings": render.lane_detail(method, trace.config),
                     "new tokens": s["new_tokens"], "target/denoiser passes": s["target_forward_passes"],
                     "draft passes": s["draft_forward_passes"], "tokens / pass": s["tokens_per_target_pass"],
                     "acceptance": s["acceptance_rate"], "TTFT ms": (s["ttft_s"] or 0) * 1e3,
                     "latency ms": s["wall_s"] * 1e3, "tokens / s": s["tokens_per_s"],
                     "speedup vs AR (per token)": speedup})
    return pd.DataFrame(rows).round(3)


@gpu
def measure(source: str, prompt: str, prompt_file: str | None, repeats: int, preset: str, lanes: list[str],
            max_new_tokens: int, temperature: float, top_p: float, seed: int, drafter: str, gamma: int,
            adaptive_gamma: bool, steps: int, block_length: int, remasking: str, threshold: float,
            history: list[Trace] | None, progress: gr.Progress = gr.Progress()) -> Iterator[tuple]:  # noqa: B008
    """Run every lane R times over the prompt (``source="prompt"``) or the uploaded prompt file; summarize."""
    settings = Settings(max_new_tokens, temperature, top_p, seed, drafter, gamma, adaptive_gamma, steps,
                        block_length, remasking, threshold)
    if source == "file" and not prompt_file:
        raise gr.Error("upload a prompt file first", print_exception=False)
    prompts = read_prompt_file(prompt_file) if source == "file" else [Prompt("prompt", prompt)]
    repeats = int(repeats)
    models = load_preset(preset, progress)
    methods = [_check_inputs(models, p.text, lanes, settings) for p in prompts][0]
    total = len(prompts) * len(methods) * repeats
    if not 1 <= repeats <= MAX_REPEATS or total > MAX_BATCH_DECODES:
        raise gr.Error(f"{total} decodes requested (prompts × lanes × repeats); the limit is {MAX_BATCH_DECODES} "
                       f"and repeats must be 1..{MAX_REPEATS}", print_exception=False)
    batch: list[Trace] = []
    skip = (gr.skip(),) * 6
    for i, (p, r, method) in enumerate((p, r, m) for p in prompts for r in range(repeats) for m in methods):
        options = settings.options(method, seed_offset=r)
        if p.temperature is not None:  # a temperature in the prompt file overrides the run's
            options["temperature"] = p.temperature
        try:  # lanes run one at a time, so every decode is timed alone
            batch.append(explorer.decode(method, models, p.text, **options))
        except ExplorerError as exc:
            raise gr.Error(f"prompt {p.id}: {exc}", print_exception=False) from None
        status = (f"{i + 1} / {total} decodes ({len(prompts)} prompt(s) × {repeats} repeat(s) × "
                  f"{len(methods)} lane(s))")
        yield (status if i % 5 == 0 else gr.skip(), *skip)  # every decode: a chance for Stop to cancel
    history = ([*(history or []), *batch])[-HISTORY_LIMIT:]
    summary = summarize(requests_frame(batch)).round(4)
    note = (f"Done: {total} decodes. Seeds {int(seed)}..{int(seed) + repeats - 1} (one per repeat). "
            f"Latency plots now cover the last {len(history)} traces of this session.")
    yield (note, summary, plots.latency_percentiles_figure(batch, models.names),
           plots.latency_cdf_figure(batch, models.names), history,
           plots.latency_percentiles_figure(history, models.names), plots.latency_cdf_figure(history, models.names))


def read_prompt_file(path: str) -> list[Prompt]:
    """The uploaded file through workload's parser (one prompt a line, or JSONL with "prompt" and an
    optional "temperature"), within the app's bounds on bytes and prompts."""
    size = Path(path).stat().st_size
    if size > MAX_PROMPT_FILE_BYTES:
        raise gr.Error(f"the prompt file is {size / 1000:.0f} kB; the limit is {MAX_PROMPT_FILE_BYTES // 1000} kB",
                       print_exception=False)
    try:
        prompts = parse_prompts(read_text_file(Path(path)), Path(path).name)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    if len(prompts) > MAX_PROMPTS:
        raise gr.Error(f"the prompt file holds {len(prompts)} prompts; the limit is {MAX_PROMPTS}",
                       print_exception=False)
    return prompts


def export_traces(history: list[Trace] | None) -> list[str]:
    """Write the session's traces as CSV (one row per request) and JSON (every event)."""
    if not history:
        raise gr.Error("no traces yet: run something first", print_exception=False)
    folder = Path(tempfile.mkdtemp(prefix="explorer-traces-"))
    csv_path, json_path = folder / "traces.csv", folder / "traces.json"
    requests_frame(history).to_csv(csv_path, index=False)
    json_path.write_text(json.dumps([t.to_dict() for t in history]), encoding="utf-8")
    return [str(csv_path), str(json_path)]


# ----------------------------------------------------------------------------------------------
# race replay: the finished traces on one shared clock, no model runs

def replay_frame(current: dict[str, Any] | None, at_ms: float) -> str:
    """All lanes of the last run as they were ``at_ms`` milliseconds after each started."""
    if not current:
        return initial_frame()
    views = {m: render.trace_view(t, current["pieces"][m], at_ms / 1e3) for m, t in current["traces"].items()}
    return _frame(views, f"Race replay at t = {at_ms:.1f} ms on one shared clock (true relative speed).")


def replay_play(current: dict[str, Any] | None, at_ms: float, slow_motion: float) -> Iterator[tuple[str, float]]:
    """Play from the scrubber position to the end at 1/slow_motion of real time."""
    if not current:
        raise gr.Error("nothing to replay yet: press Run first", print_exception=False)
    end_ms = max(t.stats["wall_s"] for t in current["traces"].values()) * 1e3
    start_ms = 0.0 if at_ms >= end_ms else float(at_ms)
    started = time.perf_counter()
    while True:
        at = start_ms + (time.perf_counter() - started) * 1e3 / max(1.0, float(slow_motion))
        if at >= end_ms:
            yield replay_frame(current, end_ms), round(end_ms + 0.1, 1)
            return
        yield replay_frame(current, at), round(at, 2)
        time.sleep(FRAME_INTERVAL_S)


def replay_step(current: dict[str, Any] | None, at_ms: float, backwards: bool = False) -> tuple[str, float]:
    """Jump to the next (or previous) event of any lane."""
    if not current:
        return initial_frame(), 0.0
    at = render.next_event_time(list(current["traces"].values()), at_ms / 1e3, backwards) * 1e3
    at = math.ceil(at * 100) / 100  # the scrubber's resolution (10 µs), rounded up so the event shows
    return replay_frame(current, at), at


# ----------------------------------------------------------------------------------------------
# layout

@dataclass
class Controls:
    """The components the event wiring needs (filled in by the builders)."""

    prompt: Any = None
    preset: Any = None
    lanes: Any = None
    settings: list[Any] = None  # in Settings field order
    run: Any = None
    stop: Any = None
    model_info: Any = None
    frame: Any = None
    run_table: Any = None
    result: Any = None
    figures: list[Any] = None  # in plots.FIGURE_KEYS order
    history: Any = None
    current: Any = None
    scrubber: Any = None
    play: Any = None
    pause: Any = None
    back: Any = None
    forward: Any = None
    slow_motion: Any = None
    repeats: Any = None
    prompt_file: Any = None
    measure_prompt: Any = None
    measure_file: Any = None
    measure_status: Any = None
    summary: Any = None
    measure_figures: list[Any] = None
    export: Any = None
    files: Any = None


def _build_prompt(c: Controls) -> None:
    with gr.Row(equal_height=False):
        c.prompt = gr.Textbox(label="Prompt", lines=3, max_lines=12, max_length=20_000, elem_id="prompt",
                              value=EXAMPLES[0][0], scale=5)
        with gr.Column(scale=1, min_width=160):
            c.run = gr.Button("▶ Run", variant="primary", elem_id="run")
            c.stop = gr.Button("■ Stop", variant="stop", elem_id="stop")


def _build_settings(c: Controls) -> list[Any]:
    """The sidebar: preset, lanes and every decoding control; returns the Settings components."""
    c.preset = gr.Dropdown(list(PRESETS), value=DEFAULT_PRESET, label="Preset")
    c.lanes = gr.CheckboxGroup(list(METHODS), value=list(METHODS), label="Lanes",
                               info="autoregressive = the reference every speedup is measured against")
    gr.Markdown("**All lanes**")
    max_new = gr.Slider(8, 256, value=48, step=8, label="max new tokens (N)")
    temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)")
    top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p (1 = off)")
    seed = gr.Number(0, precision=0, label="seed")
    gr.Markdown("**Speculative**")
    drafter = gr.Radio(["model", "prompt_lookup", "early_exit", "diffusion"], value="model", label="drafter")
    gamma = gr.Slider(1, 16, value=4, step=1, label="γ (drafts per step)")
    adaptive = gr.Checkbox(False, label="adaptive γ (+2 after a full acceptance, −1 after a rejection)")
    gr.Markdown("**Diffusion**")
    steps = gr.Slider(1, 256, value=24, step=1, label="diffusion steps (K)")
    block = gr.Slider(0, 256, value=16, step=8, label="block length (0 = one block)")
    remasking = gr.Radio(["low_confidence", "random"], value="low_confidence", label="remasking")
    threshold = gr.Slider(0, 1, value=0, step=0.05, label="confidence threshold (0 = off)")
    return [max_new, temperature, top_p, seed, drafter, gamma, adaptive, steps, block, remasking, threshold]


def _build_examples(c: Controls) -> None:
    drafter, temperature = c.settings[SETTING_NAMES.index("drafter")], c.settings[SETTING_NAMES.index("temperature")]
    gr.Examples(EXAMPLES, inputs=[c.prompt, drafter, temperature], example_labels=EXAMPLE_LABELS,
                label="Examples (each shows a different regime)")


def _build_lanes(c: Controls) -> None:
    c.model_info = gr.Markdown("Loading the default preset …", elem_id="model-info")
    c.frame = gr.HTML(initial_frame(), css_template=STYLE, apply_default_css=False, js_on_load=None,
                      elem_id="lanes")
    with gr.Group(elem_id="replay"), gr.Row(equal_height=True):
        with gr.Column(scale=1, min_width=260):
            gr.Markdown("**Race replay**: the finished runs on one shared clock, no model runs again.")
            with gr.Row():
                c.play = gr.Button("▶ Play", size="sm", elem_id="replay-play", min_width=60)
                c.pause = gr.Button("❙❙ Pause", size="sm", elem_id="replay-pause", min_width=60)
                c.back = gr.Button("◀ Step", size="sm", elem_id="replay-back", min_width=60)
                c.forward = gr.Button("Step ▶", size="sm", elem_id="replay-forward", min_width=60)
        c.slow_motion = gr.Slider(1, 200, value=10, step=1, label="slow motion (× slower than real time)", scale=1)
        c.scrubber = gr.Slider(0, 1, value=0, step=0.01, label="replay time (ms, shared clock)", elem_id="scrubber",
                               scale=2)
    c.run_table = gr.Dataframe(label="This run (speedup = time per token of the AR lane / this lane's)",
                               interactive=False, elem_id="run-table")


def _build_plots(c: Controls) -> None:
    c.figures = []
    titles = dict(zip(plots.FIGURE_KEYS, ["Running acceptance", "Per-position acceptance", "Accepted per step",
                                          "Break-even", "Latency p50/p95/p99", "Latency CDF",
                                          "Diffusion reveals"], strict=True))
    keys = list(plots.FIGURE_KEYS)
    for left, right in zip(keys[::2], keys[1::2] + [None], strict=True):
        with gr.Row():
            for key in (left, right):
                if key is not None:
                    c.figures.append(gr.Plot(label=titles[key], elem_classes=["explorer-plot"]))
    with gr.Accordion("Token ids, text and stats per lane (what the /run API returns last)", open=False):
        c.result = gr.JSON(label="Last run")


def _build_measure(c: Controls) -> None:
    gr.Markdown("Percentiles need many requests. Run the prompt above R times per lane (seed + i for repeat i), "
                f"or upload your own traffic: a `.txt` file with one prompt a line or `.jsonl` with a "
                f"`\"prompt\"` field and optionally `\"temperature\"` (at most {MAX_PROMPTS} prompts, "
                f"{MAX_PROMPT_FILE_BYTES // 1000} kB). "
                "Every decode runs alone; nothing is animated.")
    with gr.Row():
        c.repeats = gr.Slider(1, MAX_REPEATS, value=5, step=1, label="R (repeats per prompt and lane)")
        c.measure_prompt = gr.Button("Run this prompt R times", elem_id="measure-prompt")
    with gr.Row():
        c.prompt_file = gr.File(label="Prompt file (.txt / .jsonl)", file_types=[".txt", ".jsonl"], type="filepath")
        c.measure_file = gr.Button("Run the workload", elem_id="measure-file")
    c.measure_status = gr.Markdown()
    c.summary = gr.Dataframe(label="Summary (p50/p95/p99 per lane)", interactive=False)
    with gr.Row():
        c.measure_figures = [gr.Plot(label="Latency p50/p95/p99"), gr.Plot(label="Latency CDF")]
    with gr.Row():
        c.export = gr.Button("Export this session's traces (CSV + JSON)")
        c.files = gr.File(label="Traces", file_count="multiple", interactive=False)


def build_demo() -> gr.Blocks:
    """The whole app; ``app.py`` exposes it as the module-level ``demo``."""
    c = Controls()
    with gr.Blocks(title="Decoding explorer", fill_width=True) as demo:
        gr.Markdown(INTRO)
        c.history, c.current = gr.State([]), gr.State(None)
        with gr.Sidebar(label="Settings", width=330):
            c.settings = _build_settings(c)
        _build_prompt(c)
        _build_examples(c)
        _build_lanes(c)
        with gr.Tabs():
            with gr.Tab("Plots"):
                _build_plots(c)
            with gr.Tab("Measure: percentiles and workloads"):
                _build_measure(c)
            with gr.Tab("How it works"):
                gr.Markdown(HOW_IT_WORKS, latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                                            {"left": "$", "right": "$", "display": False}])
            with gr.Tab("Deployment checklist"):
                gr.Markdown(CHECKLIST)
        _wire(c, demo)
    return demo.queue(max_size=32, default_concurrency_limit=1)


def _wire(c: Controls, demo: gr.Blocks) -> None:
    """Events. Decoding handlers share one concurrency slot, so two decodes never compete for the cores."""
    decode_slot = {"concurrency_id": "decode", "concurrency_limit": 1}
    run = c.run.click(run_lanes, [c.prompt, c.preset, c.lanes, *c.settings, c.history],
                      [c.frame, c.run_table, c.result, c.model_info, *c.figures, c.history, c.current, c.scrubber],
                      api_name="run", show_progress="minimal", show_progress_on=c.model_info, **decode_slot)
    batch_inputs = [c.prompt, c.prompt_file, c.repeats, c.preset, c.lanes, *c.settings, c.history]
    session_latency = [c.figures[plots.FIGURE_KEYS.index(k)] for k in ("latency_percentiles", "latency_cdf")]
    batch_outputs = [c.measure_status, c.summary, *c.measure_figures, c.history, *session_latency]
    batch = {"outputs": batch_outputs, "show_progress_on": c.measure_status, **decode_slot}
    by_prompt = c.measure_prompt.click(measure, [gr.State("prompt"), *batch_inputs], api_name="measure", **batch)
    by_file = c.measure_file.click(measure, [gr.State("file"), *batch_inputs], api_name="workload", **batch)
    play = c.play.click(replay_play, [c.current, c.scrubber, c.slow_motion], [c.frame, c.scrubber],
                        api_visibility="undocumented", concurrency_limit=8, show_progress="hidden")
    c.pause.click(None, cancels=[play])
    c.stop.click(None, cancels=[run, by_prompt, by_file, play])
    step = {"outputs": [c.frame, c.scrubber], "api_visibility": "undocumented", "show_progress": "hidden"}
    c.forward.click(lambda cur, at: replay_step(cur, at), [c.current, c.scrubber], cancels=[play], **step)
    c.back.click(lambda cur, at: replay_step(cur, at, True), [c.current, c.scrubber], cancels=[play], **step)
    c.scrubber.release(replay_frame, [c.current, c.scrubber], c.frame, api_visibility="undocumented",
                       show_progress="hidden")
    c.export.click(export_traces, c.history, c.files, api_name="export", api_visibility="undocumented")
    c.preset.change(describe_preset, c.preset, c.model_info, api_visibility="undocumented", **decode_slot)
    demo.load(describe_preset, c.preset, c.model_info, api_visibility="undocumented", **decode_slot)


# ----------------------------------------------------------------------------------------------
# words

INTRO = """## Decoding explorer
Real **speculative** and **masked-diffusion** decoding on one prompt, next to plain **autoregressive** decoding:
every draft/verify and refinement step, token by token (hover a token for its numbers). Settings are in the sidebar."""

EXAMPLE_LABELS = ["code completion", "code editing (prompt lookup wins)", "prose", "non-English",
                  "high temperature (speculation can lose)"]
EXAMPLES = [
    ['import os\n\n\ndef list_python_files(root):\n    """Return the paths of all .py files under root."""\n',
     "model", 0.0],
    ['def area(width, height):\n    """Return the area of a rectangle."""\n    if width < 0 or height < 0:\n'
     '        raise ValueError("negative size")\n    return width * height\n\n\n'
     "# The same function, renamed:\ndef rectangle_area(width, height):\n", "prompt_lookup", 0.0],
    ["Once upon a time, in a small village by the sea, there lived", "model", 0.0],
    ["Es war einmal ein kleines Mädchen, das in einem Dorf am Meer lebte. Eines Tages", "model", 0.0],
    ["class Stack:\n    def __init__(self):\n", "model", 1.5],
]

HOW_IT_WORKS = r"""
### Autoregressive (the reference)
One target forward pass per token: $x_t \sim p(\cdot \mid x_{<t})$. Tokens per pass = 1.

### Speculative decoding (Leviathan et al. 2023, Alg. 1; Chen et al. 2023)
A cheap drafter proposes $\gamma$ tokens $d_1..d_\gamma$ drawn from $q$; **one** target pass scores all of them.
Draft $d_i$ is accepted with probability
$$\min\left(1, \frac{p(d_i)}{q(d_i)}\right)$$
On the first rejection the target resamples from $\mathrm{norm}(\max(0, p - q))$ (↻); if all $\gamma$ are accepted it
adds a bonus token from $p$ (★). The output is distributed **exactly** as the target's. With per-token acceptance
$\alpha = E[\min(1, p/q)]$ and draft/target cost ratio $c$, the expected speedup is
$$\frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)}$$
Drafters: a small **model**; **prompt lookup** (copy the continuation of the last n-gram seen in the prompt:
cheap, wins when the output repeats the input, e.g. code editing); **early exit** (the target's first layers).

*Greedy speculative output equals greedy autoregressive output token for token in float32. In bfloat16 /
float16 the batched verify pass rounds differently from one-token passes, so the two may legitimately differ.*

The acceptance rate shown is accepted / proposed drafts (vLLM's "draft acceptance rate"); Leviathan's $\alpha$ is
the mean of $\min(1, p/q)$ and is what the break-even plot uses.

### Masked diffusion (LLaDA, Nie et al. 2025, Alg. 4-5; Fast-dLLM, Wu et al. 2025)
The $N$ output positions start as [MASK]. Each of $K$ denoiser passes predicts every masked position at once and
reveals the $N/K$ most confident ones (low-confidence remasking; or random ones). Blocks are filled left to
right (semi-autoregressive). With a confidence threshold, a step reveals every position above it (at least one).
Tokens per pass = $N/K$: fewer steps is faster, but quality drops when neighbours are guessed independently.
"""

CHECKLIST = """### Before enabling speculative decoding (or adopting a diffusion LM)
1. **Acceptance on your own prompts**: upload a sample of real traffic (Measure tab). Acceptance on benchmarks
   says little about yours; it varies with task, language and temperature.
2. **The tail, not the mean**: compare p95/p99 of request latency and inter-token latency. Speculation makes
   tokens arrive in bursts; a rejection-heavy request can be slower than plain decoding.
3. **Batch size**: these numbers are at batch size 1. Under load the target is compute-bound and drafting
   costs more than it saves; re-measure at your serving batch size.
4. **Draft memory**: the draft's weights *and* its KV cache share the GPU with the target (see the preset
   line above for weight sizes).
5. **Re-measure after a swap**: a new target (or a new fine-tune) changes acceptance; a draft distilled for the
   old one may no longer pay off.
6. **Diffusion: output length N vs steps K**: tokens per pass is N/K; find where quality holds and latency wins.
7. **Quality next to speed**: speculative decoding is lossless; diffusion with fewer steps is not. Read the outputs.
"""
