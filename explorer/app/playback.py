"""Playback. Live (the default): every lane decodes at once in its own worker thread, one torch thread each, and
the page shows their events as they come; the lanes share the CPU, so their clocks run slower than alone. Timed:
a run has two phases. First each lane is decoded alone, one after another, in a worker thread that never waits for
the UI (so it is measured alone: docs/design.md); meanwhile the lane shows a progress bar a few times a second, so
the page never sits still. Then every lane plays its recorded events on one shared clock (real time, or slowed so
the longest lane lasts about AUTO_PLAY_S). The race replay re-plays or steps through the same traces without
running a model again."""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import gradio as gr
import torch

import explorer
from explorer.app import live_plots, narration, render
from explorer.app.lane_settings import Settings, preset_settings
from explorer.decoding.config import METHODS
from explorer.decoding.events import Event, Trace
from explorer.errors import ExplorerError
from explorer.runtime import Models

FRAME_INTERVAL_S = 1 / 20  # playback: at most 20 frames per second
PROGRESS_INTERVAL_S = 0.25  # while a lane decodes alone: a progress frame 4 times a second
AUTO_PLAY_S = 4.0  # "auto" playback: the longest lane plays in about this long (never faster than real time)


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


def error_text(exc: gr.Error) -> str:
    """The message a gr.Error carries (what a lane shows when its decode failed)."""
    return str(exc.message if hasattr(exc, "message") else exc)


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
# or: every lane decoded at once, shown live (Playback "live"): faster, but the lanes share the CPU

LIVE = -1.0  # the Playback value of the live mode
LIVE_INTERVAL_S = 0.25  # live frames: rendering one holds the GIL the decoders need (10 a second cost 4-5 s at N 48)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Lanes decoded at once each get one intra-op thread (measured on 2 cores with smollm2-135m, N = 48: three
    lanes in 7.5-7.9 s with one thread each, 8.9 s with two, 10.4-11.8 s one after another)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def decode_side_by_side(methods: list[str], models: Models, prompt: str, options: dict[str, dict[str, Any]],
                        stop: threading.Event | None = None) -> Iterator[tuple[dict, dict, dict, dict, dict]]:
    """Decode every lane at once, each in its own worker thread; yield (events so far, seconds since each lane
    started, finished traces, errors, each lane's start on the perf_counter clock), all by method, every
    LIVE_INTERVAL_S until every lane has ended."""
    stop = stop or threading.Event()
    inboxes = {m: queue.Queue() for m in methods}
    origins: dict[str, list[float]] = {m: [] for m in methods}
    received: dict[str, list[Event]] = {m: [] for m in methods}
    traces: dict[str, Trace] = {}
    errors: dict[str, str] = {}
    started = time.perf_counter()
    for m in methods:
        threading.Thread(target=_decode_worker, args=(m, models, prompt, options[m], inboxes[m], origins[m], stop),
                         name=f"decode-{m}", daemon=True).start()
    try:
        while True:
            deadline = time.perf_counter() + LIVE_INTERVAL_S
            for m in methods:
                if m in traces or m in errors:
                    continue
                try:
                    trace = _receive(inboxes[m], received[m], deadline)
                except gr.Error as exc:
                    errors[m] = error_text(exc)
                    continue
                if trace is not None:
                    traces[m] = trace
            clocks = {m: float(traces[m].stats["wall_s"]) if m in traces
                      else time.perf_counter() - (origins[m][0] if origins[m] else started) for m in methods}
            yield received, clocks, traces, errors, {m: origins[m][0] for m in methods if origins[m]}
            if len(traces) + len(errors) == len(methods):
                return
    finally:
        stop.set()


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


def lane_view(method: str, prompt: str, piece: render.Piece, options: dict[str, Any], status: str,
               events: list[Event] | None = None, clock: float = 0.0, **extra: Any) -> render.LaneView:
    return render.LaneView(method, events or [], prompt, piece, options["max_new_tokens"], options.get("block_length"),
                           clock, status, render.lane_detail(method, options), options=options, **extra)


def frame_html(views: dict[str, render.LaneView], caption: str = "", below: str = "") -> str:
    return render.lanes_html([render.lane_html(v) for v in views.values()], list(views), caption,
                             narration.narration_html(list(views.values())), below)


def initial_frame(methods: tuple[str, ...] = METHODS, settings: Settings | None = None, caption: str = "",
                  note: str = "") -> str:
    """The lanes before any run (or before a run's models are ready: ``note`` says why they wait): everything
    waiting, the diffusion canvas fully masked."""
    settings = settings or preset_settings()
    views = {m: lane_view(m, "", str, settings.options(m), "waiting", note=note) for m in methods}
    return frame_html(views, caption or "Press Run: all lanes decode at once, every draft/verify and refinement step "
                      "shown as it happens (a timed Playback decodes each lane alone, then replays them on one shared "
                      "clock).")


def preview_frame(current: dict[str, Any] | None, lanes: list[str], *values: Any) -> Any:
    """Before any run, the waiting lanes follow the controls (the lanes ticked, N, K, blocks, sampler); once a run is
    shown its frame stays, its headers describing that run."""
    if current:
        return gr.skip()
    try:
        settings = Settings.from_values(values)
    except (TypeError, ValueError):
        return gr.skip()
    chosen = tuple(m for m in METHODS if m in (lanes or ()))
    return initial_frame(chosen, settings, "" if chosen else "No lane is ticked: tick at least one under Lanes.")


def replay_frame(current: dict[str, Any] | None, at_ms: float, playing: bool = False, caption: str = "") -> str:
    """All lanes of the last run as they were ``at_ms`` milliseconds after each started; a lane not
    finished by then is "running" while playing and "stopped" on a still frame."""
    if not current:
        return initial_frame()
    traces, errors = current["traces"], current.get("errors", {})
    views = {m: render.trace_view(traces[m], current["pieces"][m], at_ms / 1e3,
                                  unfinished="running" if playing else "stopped") if m in traces else
             lane_view(m, "", str, {"max_new_tokens": 1}, "error", note=errors[m])
             for m in METHODS if m in traces or m in errors}  # the lanes' order, whichever finished first
    end_s = max(t.stats["wall_s"] for t in current["traces"].values())
    below = live_plots.live_plots_html([v for m, v in views.items() if m in traces],
                                   {m: t.t0 for m, t in current["traces"].items()}, end_s)
    return frame_html(views, caption or f"Race replay at t = {at_ms:.1f} ms on one shared clock (true relative speed).",
                  below)


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


def replay_step(current: dict[str, Any] | None, at_ms: float, backwards: bool = False) -> tuple[Any, Any]:
    """Jump to the next (or previous) event of any lane. With no finished run yet (a live run still going, its
    last frame not in) nothing changes: the lanes are not wiped and the scrubber is not sent back to 0."""
    if not current or not current.get("traces"):
        return gr.skip(), gr.skip()
    at = render.next_event_time(list(current["traces"].values()), float(at_ms or 0) / 1e3, backwards) * 1e3
    at = math.ceil(at * 100) / 100  # the scrubber's resolution (10 µs), rounded up so the event shows
    return replay_frame(current, at), at


def replay_at(current: dict[str, Any] | None, at_ms: float | None) -> Any:
    """The frame at a time typed into the scrubber's box or dragged to (clamped to the run); no change without a
    finished run (as ``replay_step``)."""
    if not current or not current.get("traces"):
        return gr.skip()
    end_ms = max(t.stats["wall_s"] for t in current["traces"].values()) * 1e3
    at = min(max(0.0, float(at_ms or 0)), end_ms + 0.1)
    return replay_frame(current, at)
