"""The Gradio app: Blocks wiring only (frames come from render.py, figures from plots.py).

A run has two phases. First each lane is decoded alone, one after another, in a worker thread
that never waits for the UI (so it is measured alone: docs/design.md); meanwhile the lane shows a
progress bar a few times a second, so the page never sits still. Then every lane plays on one
shared clock (real time, or slowed so the longest lane lasts about AUTO_PLAY_S), with the
narration and the plots following the playback. The race replay re-plays or steps through the
same traces without running a model again. Handlers are plain functions taking one Settings
object, so tests can call them directly.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd

import explorer
from explorer.app import hosting, live_plots, narration, plots, render
from explorer.decoding.api import make_config
from explorer.decoding.config import CACHES, DEFAULT_CACHE, DRAFTERS, METHODS, REMASKING, DecodeConfig, validate_prompt
from explorer.decoding.drafters import available_drafters
from explorer.decoding.events import Event, TokenStep, Trace, Verification
from explorer.errors import ExplorerError
from explorer.measure.metrics import BOOTSTRAP_RESAMPLES, grouped_summary, requests_frame
from explorer.measure.workload import Prompt, parse_prompts
from explorer.measure.workload import read_prompt_file as read_text_file
from explorer.models import DEFAULT_PRESET, PRESETS, Models

try:  # Hugging Face ZeroGPU: ask for a GPU while a decoding handler runs, for as long as its preset needs
    import spaces

    def gpu(duration):
        return spaces.GPU(duration=duration)
except ImportError:  # anywhere else a no-op

    def gpu(duration):
        return lambda fn: fn


HERE = Path(__file__).resolve().parent
ASSETS = HERE.parent.parent / "assets"
STYLE = (ASSETS / "style.css").read_text(encoding="utf-8")
TEXT = HERE / "text"  # the prose of the page, in Markdown
HISTORY_LIMIT = 5000  # traces kept per session (the measure tab says so; export writes all of them)
FRAME_INTERVAL_S = 1 / 20  # playback: at most 20 frames per second
PROGRESS_INTERVAL_S = 0.25  # while a lane decodes alone: a progress frame 4 times a second
AUTO_PLAY_S = 4.0  # "auto" playback: the longest lane plays in about this long (never faster than real time)
LANE_GAP_S = 0.05  # pause before each decode so the previous frame leaves before the decoder starts
MAX_PROMPTS, MAX_PROMPT_FILE_BYTES, MAX_REPEATS, MAX_BATCH_DECODES = 200, 100_000, 20, 600
SPEEDS = [("auto (about 4 s)", 0.0), ("real time", 1.0), ("2× slower", 2.0), ("10× slower", 10.0),
          ("100× slower", 100.0)]
TOKENS_PER_STEP = (1, 2, 4, 8)  # diffusion: N/K, so K follows N
BLOCKS = (1, 2, 4, 8)  # diffusion: N / block length, so the block length follows N
FLAG_FIELDS = tuple(f.name for f in fields(DecodeConfig) if f.type in ("bool", bool) and f.name != "adaptive_gamma")


def read_text(name: str) -> str:
    return (TEXT / name).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# settings and model loading

def diffusion_plan(max_new_tokens: int, tokens_per_step: int, blocks: int) -> tuple[int, int]:
    """(steps K, block length) that are valid for every N: blocks divide N, K a multiple of the blocks, K <= N."""
    n = max(1, int(max_new_tokens))
    blocks = max(1, min(int(blocks), n))
    while n % blocks:
        blocks -= 1
    block_length = n // blocks
    per_block = max(1, block_length // max(1, int(tokens_per_step)))
    return blocks * per_block, block_length


@dataclass(frozen=True)
class Settings:
    """Every decoding control, in the order of the UI inputs (after prompt, preset and lanes)."""

    max_new_tokens: int = DecodeConfig.max_new_tokens
    temperature: float = DecodeConfig.temperature
    top_p: float = 1.0
    seed: int = DecodeConfig.seed
    drafter: str = DecodeConfig.drafter
    gamma: int = DecodeConfig.gamma
    adaptive_gamma: bool = DecodeConfig.adaptive_gamma
    tokens_per_step: int = 2  # diffusion: N/K
    blocks: int = 4  # diffusion: N / block length
    remasking: str = DecodeConfig.remasking
    threshold: float = 0.0
    cache: str = DEFAULT_CACHE  # diffusion KV cache (and the diffusion drafter's)
    flags: tuple[str, ...] = tuple(name for name in FLAG_FIELDS if getattr(DecodeConfig, name))

    @classmethod
    def from_values(cls, values: list[Any] | tuple[Any, ...]) -> Settings:
        kwargs = dict(zip(SETTING_NAMES, values, strict=True))
        kwargs["flags"] = tuple(kwargs.get("flags") or ())
        return cls(**kwargs)

    def as_inputs(self) -> list[Any]:
        """The values in field order, as the UI inputs (and a gradio_client call) take them; inverse of from_values."""
        return [list(v) if isinstance(v, tuple) else v for v in (getattr(self, n) for n in SETTING_NAMES)]

    @property
    def diffusion(self) -> tuple[int, int]:
        return diffusion_plan(self.max_new_tokens, self.tokens_per_step, self.blocks)

    def options(self, method: str, seed_offset: int = 0) -> dict[str, Any]:
        """explorer.decode keyword options for ``method`` (0 means 'off' for top-p 1 and threshold 0)."""
        options: dict[str, Any] = {"max_new_tokens": int(self.max_new_tokens), "temperature": float(self.temperature),
                                   "top_p": None if self.top_p >= 1 else float(self.top_p),
                                   "seed": int(self.seed) + seed_offset}
        options.update({name: name in self.flags for name in FLAG_FIELDS})
        if method == "speculative":
            options.update(gamma=int(self.gamma), drafter=self.drafter, adaptive_gamma=bool(self.adaptive_gamma))
            if self.drafter == "diffusion":
                options.update(cache=self.cache)
        if method == "diffusion":
            steps, block = self.diffusion
            options.update(steps=steps, block_length=block, remasking=self.remasking,
                           threshold=float(self.threshold) or None, cache=self.cache)
        return options


SETTING_NAMES = [f.name for f in fields(Settings)]


def preset_settings(name: str = DEFAULT_PRESET) -> Settings:
    """The controls' starting values for a preset: its drafter and its diffusion steps and blocks."""
    p = PRESETS[name]
    return Settings(drafter=p.drafter, tokens_per_step=p.diffusion_tokens_per_step, blocks=p.diffusion_blocks)

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
    """A first decode per lane (the first pass of a model is slow) and a first set of figures (plotly loads
    its validators on first use: seconds), so neither lands in a visitor's first run."""
    drafters = available_drafters(models)
    drafter = models.preset.drafter if models.preset.drafter in drafters else "prompt_lookup"
    runs = [("autoregressive", {}), ("speculative", {"drafter": drafter}), ("diffusion", {})]
    traces = {}
    for method, extra in runs:
        with contextlib.suppress(ExplorerError):  # e.g. no diffusion model: that lane will say so when run
            traces[method] = explorer.decode(method, models, "def f(x):", max_new_tokens=4, **extra)
    plots.all_figures(list(traces.values()), traces, models.names)


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


def describe_preset(preset: str, progress: gr.Progress = gr.Progress()) -> tuple[Any, ...]:  # noqa: B008
    """The preset's description, and its defaults for the controls that depend on it: the drafters it
    can run (its own first), the diffusion steps and blocks its diffusion model was measured with."""
    models = load_preset(preset, progress)
    p = models.preset
    drafters = available_drafters(models)
    return (describe_models(models),
            gr.update(choices=drafters, value=p.drafter if p.drafter in drafters else drafters[0]),
            gr.update(value=p.diffusion_tokens_per_step), gr.update(value=p.diffusion_blocks))


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
# phase 1: each lane decoded alone (honest timing), showing only a progress bar

def decode_alone(method: str, models: Models, prompt: str, options: dict[str, Any],
                 stop: threading.Event | None = None) -> Iterator[tuple[list[Event], float, Trace | None]]:
    """Yield (events so far, seconds since the decoder started, the trace on the last item).

    The decoder runs alone in a worker thread; this yields every PROGRESS_INTERVAL_S (progress
    frames are tiny: a bar, no tokens) and once at the end with the Trace. Closing the generator
    (Stop) stops the decoder at its next event.
    """
    stop = stop or threading.Event()
    inbox: queue.Queue = queue.Queue()
    origin: list[float] = []
    worker = threading.Thread(target=_decode_worker, args=(method, models, prompt, options, inbox, origin, stop),
                              name=f"decode-{method}", daemon=True)
    started = time.perf_counter()
    worker.start()
    received: list[Event] = []
    try:
        while True:
            trace = _receive(inbox, received, time.perf_counter() + PROGRESS_INTERVAL_S)
            if trace is not None:
                yield received, float(trace.stats["wall_s"]), trace
                return
            yield received, time.perf_counter() - (origin[0] if origin else started), None
    finally:
        stop.set()


def _decode_worker(method: str, models: Models, prompt: str, options: dict[str, Any], out: queue.Queue,
                   origin: list[float], stop: threading.Event) -> None:
    """Run one decode as fast as it goes, handing each event to the UI through ``out``."""
    try:
        gen = explorer.stream(method, models, prompt, **options)
        origin.append(time.perf_counter())  # the lane's clock starts here
        while not stop.is_set():
            out.put(("event", next(gen)))
        gen.close()
        out.put(("stopped", None))
    except StopIteration as done:
        out.put(("trace", done.value))
    except Exception as exc:  # reported to the user by the UI thread
        out.put(("error", exc))


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


# ----------------------------------------------------------------------------------------------
# phase 2: every lane on one shared clock

def playback_times(end_ms: float, slow_motion: float, start_ms: float = 0.0) -> Iterator[float]:
    """Replay times (ms) from ``start_ms`` to ``end_ms``, one per frame, paced in real time at
    1/slow_motion (0 = auto: slowed so the whole playback lasts about AUTO_PLAY_S)."""
    slow = float(slow_motion) if slow_motion and slow_motion >= 1 else max(1.0, AUTO_PLAY_S * 1e3 / max(end_ms, 1e-6))
    start_ms = 0.0 if start_ms >= end_ms else float(start_ms)
    started = time.perf_counter()
    while True:
        at = start_ms + (time.perf_counter() - started) * 1e3 / slow
        if at >= end_ms:
            yield end_ms
            return
        yield at
        time.sleep(FRAME_INTERVAL_S)


def speed_words(end_ms: float, slow_motion: float) -> str:
    slow = float(slow_motion) if slow_motion and slow_motion >= 1 else max(1.0, AUTO_PLAY_S * 1e3 / max(end_ms, 1e-6))
    return "real time" if slow <= 1.0001 else f"{slow:.3g}× slower than real time"


def _lane_view(method: str, prompt: str, piece: render.Piece, options: dict[str, Any], status: str,
               events: list[Event] | None = None, clock: float = 0.0, **extra: Any) -> render.LaneView:
    return render.LaneView(method, events or [], prompt, piece, options["max_new_tokens"], options.get("block_length"),
                           clock, status, render.lane_detail(method, options), **extra)


def _frame(views: dict[str, render.LaneView], caption: str = "", below: str = "") -> str:
    return render.lanes_html([render.lane_html(v) for v in views.values()], list(views), caption,
                             narration.narration_html(list(views.values())), below)


def initial_frame(methods: tuple[str, ...] = METHODS, settings: Settings | None = None) -> str:
    """The lanes before any run: everything waiting, the diffusion canvas fully masked."""
    settings = settings or preset_settings()
    views = {m: _lane_view(m, "", str, settings.options(m), "waiting") for m in methods}
    return _frame(views, "Press Run: each lane is decoded alone (timed), then all of them play together on one "
                  "shared clock, every draft/verify and refinement step.")


def replay_frame(current: dict[str, Any] | None, at_ms: float, playing: bool = False, caption: str = "") -> str:
    """All lanes of the last run as they were ``at_ms`` milliseconds after each started; a lane not
    finished by then is "running" while playing and "stopped" on a still frame."""
    if not current:
        return initial_frame()
    views = {m: render.trace_view(t, current["pieces"][m], at_ms / 1e3, unfinished="running" if playing else "stopped")
             for m, t in current["traces"].items()}
    views |= {m: _lane_view(m, "", str, {"max_new_tokens": 1}, "error", note=note)
              for m, note in current.get("errors", {}).items()}
    end_s = max(t.stats["wall_s"] for t in current["traces"].values())
    below = live_plots.live_plots_html([views[m] for m in current["traces"]],
                                   {m: t.t0 for m, t in current["traces"].items()}, end_s)
    return _frame(views, caption or f"Race replay at t = {at_ms:.1f} ms on one shared clock (true relative speed).",
                  below)


# ----------------------------------------------------------------------------------------------
# handlers

RUN_OUTPUTS = ("frame", "run_table", "result", "model_info", *plots.FIGURE_KEYS, "plots_note", "acceptance_note",
               "why", "history", "current", "scrubber")


def _out(**values: Any) -> tuple:
    """A /run output tuple: the named values, gr.skip() for the rest."""
    return tuple(values.get(name, gr.skip()) for name in RUN_OUTPUTS)


@gpu(hosting.run_duration)
def run_lanes(prompt: str, preset: str, lanes: list[str], settings: Settings, speed: float,
              history: list[Trace] | None) -> Iterator[tuple]:
    """Decode every lane alone, then play them together on one clock with live plots; end with tables."""
    models = load_preset(preset)
    methods = _check_inputs(models, prompt, lanes, settings)
    options = {m: settings.options(m) for m in methods}
    pieces = {m: render.token_piece(_tokenizer(models, m)) for m in methods}
    views = {m: _lane_view(m, prompt, pieces[m], options[m], "waiting", note="waits its turn: each lane is timed "
                           "alone") for m in methods}
    stale = ("**The plots below are from the previous run** until this run ends; the mini-plots under the lanes "
             "follow this run live." if history else "The mini-plots under the lanes follow the run live; the plots "
             "below fill in when it ends.")
    done: dict[str, Trace] = {}
    errors: dict[str, str] = {}
    for i, method in enumerate(methods):  # phase 1: decode each lane alone
        caption = f"Decoding lane {i + 1} of {len(methods)} alone (timed); then all lanes play together."
        views[method] = _lane_view(method, prompt, pieces[method], options[method], "running", progress=0.0,
                                   note="decoding alone (timed) …")
        yield _out(frame=_frame(views, caption), plots_note=stale)
        time.sleep(LANE_GAP_S)  # let that frame leave before the decoder starts, alone
        for events, clock, trace in _guarded(decode_alone(method, models, prompt, options[method]), errors, method):
            if trace is None:
                n = render.lane_counts(method, events, options[method]["max_new_tokens"])["tokens"]
                views[method] = _lane_view(method, prompt, pieces[method], options[method], "running",
                                           progress=n / options[method]["max_new_tokens"],
                                           note=f"decoding alone: {n} / {options[method]['max_new_tokens']} tokens, "
                                                f"{clock:.2f} s")
                yield _out(frame=_frame(views, caption))
            else:
                done[method] = trace
                views[method] = _lane_view(method, prompt, pieces[method], options[method], "waiting",
                                           note=f"decoded alone in {trace.stats['wall_s']:.2f} s; waits for the "
                                                "others to play")
        if method in errors:
            views[method] = _lane_view(method, prompt, pieces[method], options[method], "error", note=errors[method])
    current = {"traces": done, "pieces": {m: pieces[m] for m in done}, "errors": errors}
    if not done:
        yield _out(frame=_frame(views, "Every lane failed."))
        raise gr.Error("; ".join(f"{m}: {e}" for m, e in errors.items()), print_exception=False)
    end_ms = max(t.stats["wall_s"] for t in done.values()) * 1e3
    words = speed_words(end_ms, speed)
    once = {"current": current, "scrubber": gr.Slider(minimum=0, maximum=round(end_ms + 0.1, 1), value=0)}
    for at in playback_times(end_ms, speed):  # phase 2: one shared clock; the mini-plots under the lanes follow
        frame = replay_frame(current, at, playing=True,
                             caption=f"All lanes on one shared clock, t = {at:.1f} ms ({words}).")
        yield _out(frame=frame, **once)
        once = {}  # the replay state goes out with the first frame, so Stop leaves a replayable run
    history = ([*(history or []), *done.values()])[-HISTORY_LIMIT:]
    figures = plots.all_figures(history, done, models.names)
    caption = (f"Each lane was decoded alone, then all played on one shared clock ({words})."
               + greedy_note(done))
    yield _out(frame=replay_frame(current, end_ms, caption=caption), run_table=run_table(done, models),
               result=token_result(done), model_info=describe_models(models),
               **{k: figures[k] for k in plots.FIGURE_KEYS},
               plots_note=f"These plots show this run ({_short(prompt)}); latency plots cover the session's "
                          f"{len(history)} traces.",
               acceptance_note=acceptance_note(done.get("speculative")), why=why_text(done),
               history=history, current=current, scrubber=gr.Slider(minimum=0, maximum=round(end_ms + 0.1, 1),
                                                                   value=round(end_ms + 0.1, 1)))
    if errors:
        raise gr.Error("; ".join(f"{m}: {e}" for m, e in errors.items()), print_exception=False)


def _guarded(frames: Iterator[tuple], errors: dict[str, str], method: str) -> Iterator[tuple]:
    """The lane's frames; an error is recorded for that lane (the other lanes still run)."""
    try:
        yield from frames
    except gr.Error as exc:
        errors[method] = str(exc.message if hasattr(exc, "message") else exc)


def _short(text: str, chars: int = 40) -> str:
    one = " ".join(text.split())
    return f"“{one[:chars]}…”" if len(one) > chars else f"“{one}”"


def acceptance_note(spec: Trace | None) -> str:
    """The lane's acceptance and the break-even plot's α̂, side by side, with why they differ."""
    if spec is None:
        return ("**Two acceptance numbers.** The lane header's *acceptance* is accepted / proposed drafts; the "
                "break-even plot's α̂ is the mean of min(1, p/q) over the drafts the target checked. Run the "
                "speculative lane to see both for this run.")
    proposed, accepted = spec.stats["proposed"], spec.stats["accepted"]
    checks = [c for e in spec.events if isinstance(e, Verification) for c in e.checks]
    alpha = float(np.mean([c.accept_prob for c in checks])) if checks else float("nan")
    first = [c for c in checks if c.position == 0]
    first_rate = sum(c.accepted for c in first) / len(first) if first else float("nan")
    rate = accepted / proposed if proposed else float("nan")
    return (f"**Two acceptance numbers, this run.** Lane header: accepted / proposed = {accepted} / {proposed} = "
            f"**{rate:.0%}**. Break-even plot: α̂ = mean of min(1, p/q) over the {len(checks)} drafts the target "
            f"checked = **{alpha:.2f}**. They differ because (1) drafts after a rejection are discarded unchecked: "
            f"they count as proposed but never enter α̂ ({proposed - len(checks)} here); (2) α̂ averages the "
            f"acceptance *probability*, the rate counts the coin's outcomes. The first draft of each step, accepted "
            f"{first_rate:.0%} of the time, is the direct estimate of α (per-position plot, position 1).")


def why_text(done: dict[str, Trace] | None = None) -> str:
    """The 'why' panel, with this machine's measured cost of a verify pass when a run has given one."""
    cost = "Run the autoregressive and speculative lanes once to see what it costs on this machine."
    ar, spec = (done or {}).get("autoregressive"), (done or {}).get("speculative")
    if ar is not None and spec is not None:
        one = [e.forward_s for e in ar.events if isinstance(e, TokenStep)]
        verify = [e for e in spec.events if isinstance(e, Verification) and e.checks]
        if one and verify:
            width = int(np.median([len(e.checks) for e in verify])) + 1
            per_pass = float(np.median([e.forward_s for e in verify]))
            base = float(np.median(one))
            cost = (f"**Measured on this machine** ({ar.stats['device']}, {ar.stats['dtype']}, preset "
                    f"`{ar.stats['preset']}`, last run): one target pass over 1 token took {base * 1e3:.2f} ms "
                    f"(median of {len(one)}), a verify pass over about {width} tokens {per_pass * 1e3:.2f} ms "
                    f"(median of {len(verify)}): **{per_pass / base:.2f}×** one token's pass for up to {width} "
                    "tokens. On a CPU the extra tokens cost real arithmetic, so the gain is smaller than on a GPU.")
    return read_text("why.md").replace("{{pass_cost}}", cost)


def token_result(done: dict[str, Trace]) -> dict[str, Any]:
    """What the API returns per lane: the token ids, the text and the stats."""
    return {m: {"token_ids": t.token_ids, "text": t.text, "stats": t.stats, "config": t.config}
            for m, t in done.items()}


def other_family(models: Models) -> bool:
    """True when the diffusion model is of another family than the target (another tokenizer)."""
    return models.diffusion_tokenizer is not models.tokenizer or bool(models.preset.diffusion_from)


RUN_TABLE_COLUMNS = ["lane", "settings", "tokens", "passes", "draft passes", "tokens / pass", "acceptance",
                     "TTFT ms", "latency ms", "tokens / s", "speedup vs AR"]


def run_table(done: dict[str, Trace], models: Models | None = None) -> pd.DataFrame:
    """One row per lane of the last run; the speedup is per token against the AR lane (one run: no spread)."""
    reference = done.get("autoregressive")
    rows = []
    for method, trace in done.items():
        s = trace.stats
        if method == "diffusion" and models is not None and other_family(models):
            speedup = "n/a: another model family"
        elif reference is not None:
            speedup = f"{plots.measured_speedup(trace, reference):.2f}× (1 run)"
        else:
            speedup = "no AR lane"
        rate = s["acceptance_rate"]
        rows.append({"lane": method, "settings": render.lane_detail(method, trace.config), "tokens": s["new_tokens"],
                     "passes": s["target_forward_passes"], "draft passes": s["draft_forward_passes"],
                     "tokens / pass": f"{s['tokens_per_target_pass'] or 0:.2f}",
                     "acceptance": "" if rate is None else f"{rate:.0%}",
                     "TTFT ms": f"{(s['ttft_s'] or 0) * 1e3:.1f}", "latency ms": f"{s['wall_s'] * 1e3:.1f}",
                     "tokens / s": f"{s['tokens_per_s'] or 0:.1f}", "speedup vs AR": speedup})
    return pd.DataFrame(rows, columns=RUN_TABLE_COLUMNS)


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




MEASURE_OUTPUTS = ("measure_status", "summary", "per_prompt", "measure_latency", "measure_cdf", "history",
                   "latency_percentiles", "latency_cdf")


@gpu(hosting.measure_duration)
def measure(source: str, prompt: str, prompt_file: str | None, repeats: int, preset: str, lanes: list[str],
            settings: Settings, history: list[Trace] | None) -> Iterator[tuple]:
    """Run every lane R times over the prompt (``source="prompt"``) or the uploaded prompt file; summarize
    per setup and per prompt, with spreads."""
    if source == "file" and not prompt_file:
        raise gr.Error("upload a prompt file first", print_exception=False)
    prompts = read_prompt_file(prompt_file) if source == "file" else [Prompt("prompt", prompt)]
    repeats = int(repeats)
    models = load_preset(preset)
    methods = [_check_inputs(models, p.text, lanes, settings) for p in prompts][0]
    total = len(prompts) * len(methods) * repeats
    if not 1 <= repeats <= MAX_REPEATS or total > MAX_BATCH_DECODES:
        raise gr.Error(f"{total} decodes requested (prompts × lanes × repeats); the limit is {MAX_BATCH_DECODES} "
                       f"and repeats must be 1..{MAX_REPEATS}", print_exception=False)
    try:
        hosting.check_measure_workload(total, settings.max_new_tokens)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    batch: list[Trace] = []
    skip = (gr.skip(),) * (len(MEASURE_OUTPUTS) - 1)
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
    history = [*(history or []), *batch]
    dropped = max(0, len(history) - HISTORY_LIMIT)
    history = history[-HISTORY_LIMIT:]
    frame = requests_frame(batch)
    family = [preset] if other_family(models) else []
    note = (f"Done: {total} decodes. Seeds {int(settings.seed)}..{int(settings.seed) + repeats - 1} (one per "
            f"repeat). The session now holds {len(history)} traces; **Export** writes all of them"
            + (f" (the oldest {dropped} were dropped: the session keeps at most {HISTORY_LIMIT})." if dropped else ".")
            + f" Brackets: 95% bootstrap interval ({BOOTSTRAP_RESAMPLES} resamples); ⚠ marks fewer than 5 samples.")
    yield (note, summary_table(grouped_summary(frame, family)),
           summary_table(grouped_summary(frame, family, by_prompt=True), by_prompt=True),
           plots.latency_percentiles_figure(batch, models.names), plots.latency_cdf_figure(batch, models.names),
           history, plots.latency_percentiles_figure(history, models.names),
           plots.latency_cdf_figure(history, models.names))


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
    columns = ["setup", *(["prompt"] if by_prompt else []), "n", "latency p50 ms",
               *([] if by_prompt else ["p95 ms", "p99 ms"]), "TTFT p50 ms", "acceptance", "speedup vs AR"]
    if summary.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for r in summary.to_dict("records"):
        setup = [r["method"], f"preset {r['preset']}", f"T={r['temperature']}"]
        if r["method"] == "speculative":
            setup[1:1] = [f"{r['drafter']}", f"γ={r['gamma']}"]
        if r["method"] == "diffusion":
            setup[1:1] = [f"K={r.get('steps')}", f"block {r.get('block_length') or 'N'}"]
        row = {"setup": " · ".join(str(x) for x in setup)}
        if by_prompt:
            row["prompt"] = _short(r["prompt"], 32)
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
    """Write every trace of the session: CSV (one row per request, with its prompt and every setting) and
    JSON (every event)."""
    if not history:
        raise gr.Error("no traces yet: run something first", print_exception=False)
    folder = Path(tempfile.mkdtemp(prefix="explorer-traces-"))
    csv_path, json_path = folder / "traces.csv", folder / "traces.json"
    requests_frame(history).to_csv(csv_path, index=False)
    json_path.write_text(json.dumps([t.to_dict() for t in history]), encoding="utf-8")
    return [str(csv_path), str(json_path)]


# ----------------------------------------------------------------------------------------------
# race replay: the finished traces on one shared clock, no model runs

def replay_play(current: dict[str, Any] | None, at_ms: float, speed: float) -> Iterator[tuple[str, float]]:
    """Play from the scrubber position to the end (speed as the Run's playback)."""
    if not current or not current.get("traces"):
        raise gr.Error("nothing to replay yet: press Run first", print_exception=False)
    end_ms = max(t.stats["wall_s"] for t in current["traces"].values()) * 1e3
    words = speed_words(end_ms, speed)
    for at in playback_times(end_ms, speed, float(at_ms or 0)):
        caption = f"Race replay, t = {at:.1f} ms on one shared clock ({words})."
        yield replay_frame(current, at, playing=at < end_ms, caption=caption), round(at if at < end_ms else end_ms
                                                                                      + 0.1, 2)


def replay_step(current: dict[str, Any] | None, at_ms: float, backwards: bool = False) -> tuple[str, float]:
    """Jump to the next (or previous) event of any lane."""
    if not current or not current.get("traces"):
        return initial_frame(), 0.0
    at = render.next_event_time(list(current["traces"].values()), float(at_ms or 0) / 1e3, backwards) * 1e3
    at = math.ceil(at * 100) / 100  # the scrubber's resolution (10 µs), rounded up so the event shows
    return replay_frame(current, at), at


def replay_at(current: dict[str, Any] | None, at_ms: float | None) -> str:
    """The frame at a time typed into the scrubber's box or dragged to (clamped to the run)."""
    if not current or not current.get("traces"):
        return initial_frame()
    end_ms = max(t.stats["wall_s"] for t in current["traces"].values()) * 1e3
    at = min(max(0.0, float(at_ms or 0)), end_ms + 0.1)
    return replay_frame(current, at)


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


def _build_prompt(c: Controls) -> None:
    with gr.Row(equal_height=False, elem_id="prompt-row"):
        c.prompt = gr.Textbox(label="Prompt", lines=2, max_lines=12, max_length=20_000, elem_id="prompt",
                              value=EXAMPLES[0][0], scale=5)
        with gr.Column(scale=1, min_width=150, elem_id="run-column"):
            c.run = gr.Button("▶ Run", variant="primary", elem_id="run")
            c.stop = gr.Button("■ Stop", variant="stop", elem_id="stop")
            c.presenter = gr.Checkbox(False, label="Presenter mode", elem_id="presenter",
                                      info="large type, sidebar closed")


def _build_settings(c: Controls, default_preset: str) -> list[Any]:
    """The sidebar: preset, lanes and every decoding control; returns the Settings components."""
    d = preset_settings(default_preset)
    choices, hidden_note = hosting.preset_choices()  # GPU presets only where CUDA is; random-gemma4 nowhere
    c.preset = gr.Dropdown(choices, value=default_preset, label="Preset", info=hidden_note)
    c.lanes = gr.CheckboxGroup(list(METHODS), value=list(METHODS), label="Lanes",
                               info="autoregressive = the reference every speedup is measured against")
    c.speed = gr.Dropdown(SPEEDS, value=0.0, label="Playback", elem_id="speed",
                          info="decoding is always timed at full speed; this only paces the animation")
    gr.Markdown("**All lanes**")
    max_new = gr.Slider(8, 256, value=d.max_new_tokens, step=8, label="max new tokens (N)", elem_id="max-new")
    temperature = gr.Slider(0, 2, value=d.temperature, step=0.05, label="temperature (0 = greedy)")
    top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="top-p (1 = off)")
    seed = gr.Number(d.seed, precision=0, label="seed")
    gr.Markdown("**Speculative**")
    drafter = gr.Radio(list(DRAFTERS), value=d.drafter, label="drafter")
    gamma = gr.Slider(1, 16, value=d.gamma, step=1, label="γ (drafts per step)")
    adaptive = gr.Checkbox(d.adaptive_gamma, label="adaptive γ (+2 after a full acceptance, −1 after a rejection)")
    gr.Markdown("**Diffusion** (K and the block length follow N)")
    per_step = gr.Radio([(f"N/{r}" if r > 1 else "N (one token a pass)", r) for r in TOKENS_PER_STEP],
                        value=d.tokens_per_step, label="steps K (tokens revealed per pass = N/K)")
    blocks = gr.Radio([(f"N/{b}" if b > 1 else "N (one block)", b) for b in BLOCKS], value=d.blocks,
                      label="block length (blocks are filled left to right)")
    remasking = gr.Radio(list(REMASKING), value=d.remasking, label="remasking")
    threshold = gr.Slider(0, 1, value=d.threshold, step=0.05, label="confidence threshold (0 = off)")
    cache = gr.Radio(list(CACHES), value=d.cache, label="KV cache (Fast-dLLM)",
                     info="prefix: prompt and finished blocks; dual: also the masked suffix. Approximate.")
    flags = gr.CheckboxGroup(list(FLAG_FIELDS), value=list(d.flags), label="options", visible=bool(FLAG_FIELDS))
    plan = gr.Markdown(plan_text(d.max_new_tokens, d.tokens_per_step, d.blocks), elem_id="diffusion-plan")
    for control in (max_new, per_step, blocks):
        control.change(plan_text, [max_new, per_step, blocks], plan, api_visibility="undocumented",
                       show_progress="hidden", queue=False)
    return [max_new, temperature, top_p, seed, drafter, gamma, adaptive, per_step, blocks, remasking, threshold, cache,
            flags]


def plan_text(max_new_tokens: int, tokens_per_step: int, blocks: int) -> str:
    steps, block = diffusion_plan(max_new_tokens, tokens_per_step, blocks)
    n = int(max_new_tokens)
    return f"Diffusion will make **K = {steps}** passes over N = {n} tokens in {n // block} block(s) of {block}."


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
                               label="This run, one row per lane (press Run to fill it)", wrap=True)


def _build_plots(c: Controls) -> None:
    c.plots_note = gr.Markdown("Plots appear as the lanes play: press Run.", elem_id="plots-note")
    empty = plots.all_figures([], {})
    c.figures = []
    keys = list(plots.FIGURE_KEYS)
    for left, right in zip(keys[::2], keys[1::2] + [None], strict=True):
        with gr.Row():
            for key in (left, right):
                if key is not None:
                    c.figures.append(gr.Plot(empty[key], label=key.replace("_", " "), elem_classes=["explorer-plot"],
                                             elem_id=f"plot-{key}"))
            if right is None:
                c.acceptance_note = gr.Markdown(acceptance_note(None), elem_id="acceptance-note")
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
        c.repeats = gr.Slider(1, MAX_REPEATS, value=5, step=1, label="R (repeats per prompt and lane)")
        c.measure_prompt = gr.Button("Run this prompt R times", elem_id="measure-prompt")
    with gr.Row():
        c.prompt_file = gr.File(label="Prompt file (.txt / .jsonl)", file_types=[".txt", ".jsonl"], type="filepath")
        c.measure_file = gr.Button("Run the workload", elem_id="measure-file")
    c.measure_status = gr.Markdown("Nothing measured yet: the tables fill after a measurement.")
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


AUDIT_MAX_SAMPLES = 2000  # one audit request holds the decode slot: bounded


def _build_audit(c: Controls) -> None:
    gr.Markdown("Samples the speculative decoder's first tokens on the prompt above and tests them against the "
                "target's exact distribution (enumerated from p), with the power to see the known sampler bugs "
                "*here*: the same verdict as `python -m explorer audit` (PASS / FAIL / INCONCLUSIVE). "
                f"At most {AUDIT_MAX_SAMPLES} samples per request.")
    with gr.Row():
        c.audit_temperature = gr.Slider(0.1, 2, value=1.0, step=0.05, label="temperature")
        c.audit_top_k = gr.Slider(1, 64, value=8, step=1, label="top-k (makes the first token enumerable)")
        c.audit_gamma = gr.Slider(1, 8, value=3, step=1, label="γ")
    c.audit_run = gr.Button("Run the audit", elem_id="audit-run")
    c.audit_out = gr.Markdown("No audit yet.", elem_id="audit-out")


@gpu(hosting.run_duration)
def run_audit_tab(prompt: str, preset: str, temperature: float, top_k: int, gamma: int) -> str:
    """The audit of the current prompt and preset, in words (``audit.report_lines``)."""
    from explorer.measure.audit import report_lines, run_audit

    try:
        validate_prompt(prompt)
        models = load_preset(preset)
        result = run_audit(models, prompt, temperature=float(temperature), top_k=int(top_k), gamma=int(gamma),
                           max_samples=AUDIT_MAX_SAMPLES)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    lines = report_lines(result)
    return f"### {result.status}\n\n```\n" + "\n".join(lines) + "\n```"


def build_demo(default_preset: str = DEFAULT_PRESET) -> gr.Blocks:
    """The whole app, opening on ``default_preset``; ``app.py`` exposes it as the module-level ``demo``."""
    c = Controls()
    with gr.Blocks(title="Decoding explorer", fill_width=True) as demo:
        gr.HTML(f"<style>{PAGE_CSS}</style>", apply_default_css=False, padding=False, elem_id="page-style")
        gr.Markdown(read_text("intro.md"), elem_id="intro")
        c.history, c.current = gr.State([]), gr.State(None)
        with gr.Sidebar(label="Settings", width=330, elem_id="sidebar") as c.sidebar:
            c.settings = _build_settings(c, default_preset)
        _build_prompt(c)
        _build_examples(c)
        _build_lanes(c)
        with gr.Tabs():
            with gr.Tab("Plots"):
                _build_plots(c)
            with gr.Tab("Measure: percentiles and workloads"):
                _build_measure(c)
            with gr.Tab("How it works"):
                gr.Markdown(read_text("how_it_works.md"),
                            latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                              {"left": "$", "right": "$", "display": False}])
            with gr.Tab("Audit: is it lossless?"):
                _build_audit(c)
            with gr.Tab("Deployment checklist"):
                gr.Markdown(read_text("checklist.md"))
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
    """Events. Decoding handlers share one concurrency slot, so two decodes never compete for the cores."""
    decode_slot = {"concurrency_id": "decode", "concurrency_limit": 1}
    outputs = {"frame": c.frame, "run_table": c.run_table, "result": c.result, "model_info": c.model_info,
               **dict(zip(plots.FIGURE_KEYS, c.figures, strict=True)), "plots_note": c.plots_note,
               "acceptance_note": c.acceptance_note, "why": c.why, "history": c.history, "current": c.current,
               "scrubber": c.scrubber}
    c.run.click(None, js=SCROLL_JS)
    run = c.run.click(with_settings(run_lanes, 3), [c.prompt, c.preset, c.lanes, *c.settings, c.speed, c.history],
                      [outputs[name] for name in RUN_OUTPUTS], api_name="run", show_progress="hidden",
                      **decode_slot)
    batch_inputs = [c.prompt, c.prompt_file, c.repeats, c.preset, c.lanes, *c.settings, c.history]
    batch_outputs = [c.measure_status, c.summary, c.per_prompt, *c.measure_figures, c.history,
                     outputs["latency_percentiles"], outputs["latency_cdf"]]
    batch = {"outputs": batch_outputs, "show_progress_on": c.measure_status, **decode_slot}
    by_prompt = c.measure_prompt.click(with_settings(measure, 6), [gr.State("prompt"), *batch_inputs],
                                       api_name="measure", **batch)
    by_file = c.measure_file.click(with_settings(measure, 6), [gr.State("file"), *batch_inputs],
                                   api_name="workload", **batch)
    c.audit_run.click(run_audit_tab, [c.prompt, c.preset, c.audit_temperature, c.audit_top_k, c.audit_gamma],
                      c.audit_out, api_name="audit", show_progress_on=c.audit_out, **decode_slot)
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
    c.export.click(export_traces, c.history, c.files, api_name="export", api_visibility="undocumented")
    c.presenter.change(lambda on: gr.Sidebar(open=not on), c.presenter, c.sidebar, js=PRESENTER_JS,
                       api_visibility="undocumented", queue=False)
    follows = [c.model_info] + [c.settings[SETTING_NAMES.index(n)] for n in ("drafter", "tokens_per_step", "blocks")]
    c.preset.change(describe_preset, c.preset, follows, api_visibility="undocumented", **decode_slot)
    demo.load(describe_preset, c.preset, follows, api_visibility="undocumented", **decode_slot)
    demo.load(None, js=LOAD_JS)


# ----------------------------------------------------------------------------------------------
# page behaviour (JS) and page-wide style

SCROLL_JS = """() => { window.explorerStopUntil = 0; const el = document.querySelector('#lanes');
  if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); }"""
# Stop / Pause: a cancelled handler sends no last frame (and a frame already on its way may still land), so
# for a moment after the click every lane still marked as moving is settled as stopped, after each update too.
SETTLE_JS = """() => {
  const lanes = document.querySelector('#lanes');
  const settle = () => lanes.querySelectorAll('.lane').forEach((lane) => {
    if (lane.dataset.status === 'running' || lane.dataset.status === 'waiting') {
      lane.dataset.status = 'stopped';
      const badge = lane.querySelector('.status'); if (badge) badge.textContent = 'stopped';
      const note = lane.querySelector('.note'); if (note) note.textContent = 'stopped by the user';
    } });
  const opts = {subtree: true, childList: true};
  window.explorerStopUntil = performance.now() + 3000;
  const watch = new MutationObserver(() => {
    watch.disconnect();
    if (performance.now() > window.explorerStopUntil) return;
    settle(); watch.observe(lanes, opts);
  });
  settle(); watch.observe(lanes, opts);
  setTimeout(() => watch.disconnect(), 3100);
}"""
PRESENTER_JS = """(on) => { document.body.classList.toggle('presenter', !!on); return on; }"""
# narrow screens start with the sidebar closed so Run is reachable; ?presenter=1 starts in presenter mode
LOAD_JS = """() => {
  const close = () => { const b = document.querySelector('.sidebar.open .toggle-button, .sidebar.open button');
    if (b) b.click(); };
  if (window.innerWidth < 900) setTimeout(close, 300);
  if (new URLSearchParams(location.search).get('presenter') === '1') {
    const box = document.querySelector('#presenter input'); if (box && !box.checked) box.click(); }
}"""
PAGE_CSS = (ASSETS / "page.css").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# examples

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
