"""The Run button's handler and what it shows besides the lanes: the run table, the acceptance and greedy
notes, the "why" text. Handlers are plain functions taking one Settings object, so tests call them directly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd

from explorer.app import hosting, live_plots, plots, prefill, render, runs, turns
from explorer.app.hosting import gpu
from explorer.app.lane_settings import Settings, check_inputs, describe_models, lane_tokenizer, load_preset
from explorer.app.page import read_text
from explorer.app.playback import (
    decode_alone,
    decode_side_by_side,
    error_text,
    frame_html,
    initial_frame,
    lane_view,
    one_torch_thread,
    playback_times,
    replay_frame,
    speed_words,
)
from explorer.app.turns import DECODES
from explorer.decoding.config import METHODS
from explorer.decoding.events import TokenStep, Trace, Verification
from explorer.measure.metrics import noise_flag
from explorer.precision import EXACT
from explorer.runtime import Models

HISTORY_LIMIT = 5000  # traces kept per session (the measure tab says so; export writes all of them)
LONG_PROMPT_TOKENS = 512  # above this the Run warns that the prefill delays the first token
LANE_GAP_S = 0.05  # pause before each decode so the previous frame leaves before the decoder starts


# ----------------------------------------------------------------------------------------------
# handlers

RUN_OUTPUTS = ("frame", "run_table", "result", "model_info", *plots.FIGURE_KEYS, "plots_note", "acceptance_note",
               "why", "history", "current", "scrubber", "runs", "runs_table", "show_run", "compare", "compare_plot")


def _out(**values: Any) -> tuple:
    """A /run output tuple: the named values, gr.skip() for the rest."""
    return tuple(values.get(name, gr.skip()) for name in RUN_OUTPUTS)


def run_lanes(prompt: str, preset: str, lanes: list[str], settings: Settings, speed: float,
              history: list[Trace] | None, past_runs: list[dict] | None = None) -> Iterator[tuple]:
    """Wait for the decoder (one decode at a time for every tab), saying how many are ahead; then decode every
    lane alone, play them together on one clock with live plots, and end with tables (``_run_lanes``)."""
    chosen = tuple(m for m in METHODS if m in (lanes or []))
    with DECODES.ticket("run") as ticket:
        while not DECODES.take(ticket, timeout=turns.POLL_S):
            words = DECODES.words(ticket)
            yield _out(frame=initial_frame(chosen, settings, f"{words[0].upper()}{words[1:]}.", note=words))
        yield from _run_lanes(prompt, preset, lanes, settings, speed, history, past_runs)


@gpu(hosting.run_duration)
def _run_lanes(prompt: str, preset: str, lanes: list[str], settings: Settings, speed: float,
               history: list[Trace] | None, past_runs: list[dict] | None = None) -> Iterator[tuple]:
    chosen = tuple(m for m in METHODS if m in (lanes or []))
    if chosen:  # at once: the lanes say what they wait for (a preset loads in seconds the first time)
        yield _out(frame=initial_frame(chosen, settings, f"Preparing preset {preset} (loaded and warmed up the first "
                                       "time only) …", note=f"waits for preset {preset} to load"))
    models = load_preset(preset)
    methods = check_inputs(models, prompt, lanes, settings)
    prompt_tokens = len(lane_tokenizer(models, "autoregressive")(prompt).input_ids)
    options = {m: settings.options(m) for m in methods}
    reading: dict[str, float] = {}  # a long prompt: each lane's estimated prefill seconds, measured on this machine
    if prompt_tokens > LONG_PROMPT_TOKENS:
        reading = prefill.estimate(models, prompt_tokens, options)
        fits = prefill.limit_tokens(models)
        if prompt_tokens > fits:
            raise gr.Error(f"This prompt is {prompt_tokens:,} tokens: reading it once (the prefill) takes about "
                           f"{prompt_tokens * prefill.seconds_per_token(models):.0f} s on this machine, over the "
                           f"{prefill.PREFILL_LIMIT_S:.0f} s this page allows. About {fits:,} tokens fit here: shorten "
                           "it.", print_exception=False)
        gr.Warning(f"A long prompt: {prompt_tokens:,} tokens. Every lane reads all of it before its first token: "
                   + ", ".join(f"{m} about {s:.0f} s" for m, s in reading.items()) + " alone on this machine.")
    pieces = {m: render.token_piece(lane_tokenizer(models, m)) for m in methods}
    views = {m: lane_view(m, prompt, pieces[m], options[m], "waiting", note="waits its turn: each lane is timed "
                           "alone") for m in methods}
    stale = ("**The plots below are from the previous run** until this run ends; the mini-plots under the lanes "
             "follow this run live." if history else "The mini-plots under the lanes follow the run live; the plots "
             "below fill in when it ends.")
    done: dict[str, Trace] = {}
    errors: dict[str, str] = {}
    live = speed is not None and float(speed) < 0
    if live:
        yield from _decode_live(methods, models, prompt, options, pieces, views, done, errors,
                                {m: (prompt_tokens, s) for m, s in reading.items()})
    for i, method in enumerate(methods if not live else ()):  # phase 1: decode each lane alone
        caption = f"Decoding lane {i + 1} of {len(methods)} alone (timed); then all lanes play together."
        views[method] = lane_view(method, prompt, pieces[method], options[method], "running", progress=0.0,
                                   note="decoding alone (timed) …")
        yield _out(frame=frame_html(views, caption), plots_note=stale)
        time.sleep(LANE_GAP_S)  # let that frame leave before the decoder starts, alone
        for events, clock, trace in _guarded(decode_alone(method, models, prompt, options[method]), errors, method):
            if trace is None:
                n = render.lane_counts(method, events, options[method]["max_new_tokens"])["tokens"]
                note = (prefill.reading_note(prompt_tokens, reading[method], clock) if method in reading and not events
                        else f"decoding alone: {n} / {options[method]['max_new_tokens']} tokens, {clock:.2f} s")
                views[method] = lane_view(method, prompt, pieces[method], options[method], "running",
                                           progress=n / options[method]["max_new_tokens"], note=note)
                yield _out(frame=frame_html(views, caption))
            else:
                done[method] = trace
                views[method] = lane_view(method, prompt, pieces[method], options[method], "waiting",
                                           note=f"decoded alone in {trace.stats['wall_s']:.2f} s; waits for the "
                                                "others to play")
        if method in errors:
            views[method] = lane_view(method, prompt, pieces[method], options[method], "error", note=errors[method])
    done = {m: done[m] for m in methods if m in done}  # the lanes' order, never the order they finished in
    current = {"traces": done, "pieces": {m: pieces[m] for m in done}, "errors": errors}
    if not done:
        yield _out(frame=frame_html(views, "Every lane failed."))
        raise gr.Error("; ".join(f"{m}: {e}" for m, e in errors.items()), print_exception=False)
    end_ms = max(t.stats["wall_s"] for t in done.values()) * 1e3
    words = "they shared the CPU" if live else speed_words(end_ms, speed)
    once = {"current": current, "scrubber": gr.Slider(minimum=0, maximum=round(end_ms + 0.1, 1), value=0)}
    for at in playback_times(end_ms, speed) if not live else ():  # phase 2: one shared clock; mini-plots follow
        frame = replay_frame(current, at, playing=True,
                             caption=f"All lanes on one shared clock, t = {at:.1f} ms ({words}).")
        yield _out(frame=frame, **once)
        once = {}  # the replay state goes out with the first frame, so Stop leaves a replayable run
    history = ([*(history or []), *done.values()])[-HISTORY_LIMIT:]
    caption = ((f"All lanes were decoded at once and shown as they went ({words}, so each lane's clock ran slower "
                "than it would alone; a 'timed' Playback times each lane alone)." if live else
                f"Each lane was decoded alone, then all played on one shared clock ({words}).") + greedy_note(done))
    number = past_runs[-1]["number"] + 1 if past_runs else 1
    for trace in done.values():
        trace.stats["batch"] = f"run {number}"  # the export's batch column
    run = runs.make_run(number, prompt, preset, current, "live" if live else "timed", caption=caption)
    past_runs = runs.add_run(past_runs, run)
    run["table"] = table = run_table(done, models, run, past_runs)
    figures = plots.all_figures(history, done, models.names, runs.labelled_speculative(past_runs),
                                runs.earlier_points(past_runs))
    labels = [runs.run_label(r) for r in reversed(past_runs)]
    yield _out(frame=replay_frame(current, end_ms, caption=caption), run_table=table,
               runs=past_runs, runs_table=runs.history_table(past_runs),
               show_run=gr.Dropdown(choices=labels, value=labels[0]),
               compare=gr.Dropdown(choices=labels, value=labels[:3], multiselect=True),
               compare_plot=runs.compare_figure(past_runs, labels[:3]),
               result=token_result(done), model_info=describe_models(models),
               **{k: figures[k] for k in plots.FIGURE_KEYS},
               plots_note=f"These plots show this run ({short_text(prompt)}); latency plots cover the session's "
                          f"{len(history)} traces.",
               acceptance_note=acceptance_note(done.get("speculative")), why=why_text(done),
               history=history, current=current, scrubber=gr.Slider(minimum=0, maximum=round(end_ms + 0.1, 1),
                                                                   value=round(end_ms + 0.1, 1)))
    if errors:
        raise gr.Error("; ".join(f"{m}: {e}" for m, e in errors.items()), print_exception=False)


def show_run(past_runs: list[dict] | None, label: str | None) -> tuple:
    """An earlier run of this page again (lanes at their end, its run table, the replay on it); no model runs."""
    run = next((r for r in past_runs or [] if runs.run_label(r) == label), None)
    if run is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    current = run["current"]
    end_ms = max(t.stats["wall_s"] for t in current["traces"].values()) * 1e3
    caption = f"Run history: {runs.run_label(run)} (no model ran again). {run['caption']}"
    return (replay_frame(current, end_ms, caption=caption), current, run["table"],
            gr.Slider(minimum=0, maximum=round(end_ms + 0.1, 1), value=round(end_ms + 0.1, 1)))


def _decode_live(methods: list[str], models: Models, prompt: str, options: dict, pieces: dict, views: dict,
                 done: dict[str, Trace], errors: dict[str, str],
                 reading: dict[str, tuple[int, float]] | None = None) -> Iterator[tuple]:
    """Playback "live": every lane decodes at once (one torch thread each) and its tokens show as they come;
    ``reading``: (prompt tokens, estimated seconds) of each lane's long prefill, said while it has no token yet."""
    reading = reading or {}
    caption = "All lanes decoding at once, shown live (they share the CPU, so each runs slower than alone)."
    with one_torch_thread():
        for received, clocks, traces, failed, starts in decode_side_by_side(methods, models, prompt, options):
            for m in methods:
                if m in failed:
                    views[m] = lane_view(m, prompt, pieces[m], options[m], "error", note=failed[m])
                elif m in traces:
                    views[m] = render.trace_view(traces[m], pieces[m])
                else:
                    note = prefill.reading_note(*reading[m], clocks[m]) if m in reading and not received[m] else ""
                    views[m] = lane_view(m, prompt, pieces[m], options[m], "running", events=list(received[m]),
                                         clock=clocks[m], note=note)
            shown = [views[m] for m in methods if m not in failed]
            below = live_plots.live_plots_html(shown, starts, max(clocks.values(), default=0.0))
            yield _out(frame=frame_html(views, caption, below))
    done.update(traces)
    errors.update(failed)


def _guarded(frames: Iterator[tuple], errors: dict[str, str], method: str) -> Iterator[tuple]:
    """The lane's frames; an error is recorded for that lane (the other lanes still run)."""
    try:
        yield from frames
    except gr.Error as exc:
        errors[method] = error_text(exc)


def short_text(text: str, chars: int = 40) -> str:
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
            precision = ar.stats.get("precision", ar.stats["dtype"])
            cost = (f"**Measured on this machine** ({ar.stats['device']}, {precision}, preset "
                    f"`{ar.stats['preset']}`, last run): one target pass over 1 token took {base * 1e3:.2f} ms "
                    f"(median of {len(one)}), a verify pass over about {width} tokens {per_pass * 1e3:.2f} ms "
                    f"(median of {len(verify)}): **{per_pass / base:.2f}×** one token's pass for up to {width} "
                    "tokens. On a CPU the extra tokens cost real arithmetic, so the gain is smaller than on a GPU.")
            noisy = noise_flag(one[1:], [e.forward_s for e in verify if e.step > 0])  # past the prefills
            cost += f" **{noisy}**: this ratio is not to be trusted." if noisy else ""
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
RUN_TABLE_WIDTHS = ["11%", "19%", "6%", "6%", "6%", "6%", "7%", "7%", "7%", "7%", "18%"]  # fits 1280 px


def run_table(done: dict[str, Trace], models: Models | None = None, run: dict | None = None,
              past_runs: list[dict] | None = None) -> pd.DataFrame:
    """One row per lane of the last run; the speedup is per token against the AR lane, with the playback and
    precision it came from (``runs.speedup_cell``: a spread once several runs share the setup)."""
    reference = done.get("autoregressive")
    rows = []
    for method, trace in done.items():
        s = trace.stats
        if method == "diffusion" and models is not None and other_family(models):
            speedup = "n/a: another model family"
        elif method == "autoregressive" and reference is not None:
            speedup = "1 (reference)"
        elif run is not None:
            speedup = runs.speedup_cell(run, past_runs or [run], method)
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
    dtype = spec.stats.get("precision", spec.stats["dtype"])
    if ar.token_ids == spec.token_ids:
        return f" Greedy check: speculative output equals the autoregressive output token for token ({dtype})."
    first = next((i for i, (a, b) in enumerate(zip(ar.token_ids, spec.token_ids, strict=False)) if a != b),
                 min(len(ar.token_ids), len(spec.token_ids)))
    exact = dtype in ("float32", *EXACT)
    expected = f"unexpected in {dtype}: a bug" if exact else "rounding differs in half precision"
    return f" Greedy check: the outputs differ from token {first + 1} on ({dtype}: {expected})."
