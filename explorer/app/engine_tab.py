"""The Engine tab: a live vLLM server (``python -m explorer engine start``, or your own) under a workload, with
plots that follow it, and one request's bursts next to the explorer's own speculative lane on one clock.

The workload runs in a worker thread (engine.traffic.run_bench); the handler polls what it has finished and
redraws at most every POLL_S, so the page follows the run, and Stop (a per-session threading.Event) ends it
after the requests in flight. Bad input and a server that does not answer end in one status line, never an
exception: the page keeps serving. Layout and wiring live here too, so ui.py imports the engine only where the
tab is shown (not on a Space).

Every fetch goes through the tab's ``EnginePolicy`` (explorer/engine/allow.py), read per request from how the app
was launched (bind address, share link, proxy): on a server shared with a class it fetches only the engines its
operator listed, and nothing at all (not even at page load) until some are.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd

from explorer.app.engine_compare import compare_frame, compare_one
from explorer.app.page import STYLE, read_text
from explorer.app.turns import DECODES
from explorer.engine.allow import EnginePolicy, exposure, policy_for
from explorer.engine.client import RequestRecord
from explorer.engine.figures import acceptance_over_time_figure, latency_figure, throughput_figure
from explorer.engine.server import default_url, engine_at
from explorer.engine.traffic import (
    ConfigResult,
    EngineBench,
    Target,
    parse_concurrency,
    resolve_targets,
    run_bench,
    summary_rows,
)
from explorer.errors import ExplorerError
from explorer.measure.workload import Prompt, parse_prompts

POLL_S = 0.25  # the workload's plots and status redraw at most 4 times a second
MAX_CONCURRENCY, MAX_REQUESTS, MAX_PROMPTS = 64, 2000, 200  # one click cannot queue hours of work
DEFAULT_PROMPTS = "\n".join([
    "def read_config(path):",
    "class Stack:",
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash table is in two sentences.",
    "for i in range(10):",
])
NO_ENGINE = ("No engine started here: run `python -m explorer engine start` in a shell, or give the URL of your "
             "own vLLM server.")
WORKLOAD_OUTPUTS = ("status", "acceptance", "latency", "itl", "throughput", "table")
TABLE_COLUMNS = ["server", "c", "state", "n", "errors", "tok/s", "e2e p50", "e2e p99", "ITL p50", "ITL p99",
                 "TTFT p99", "batch", "tok/step", "acceptance", "gain"]
_CANCELS: dict[str, threading.Event] = {}  # session -> the Stop of its running workload


# ----------------------------------------------------------------------------------------------
# which server, under which name

def tab_policy(demo: gr.Blocks | None = None, request: gr.Request | None = None) -> EnginePolicy:
    """What the tab may fetch for this request: from how ``demo`` was launched (bind address, share link, root
    path), the visitor's request (a proxy's forwarding headers) and, where those say nothing, the environment."""
    headers = getattr(request, "headers", None) if request is not None else None
    client = getattr(request, "client", None) if request is not None else None
    why = exposure(getattr(demo, "server_name", None), bool(getattr(demo, "share", False)),
                   getattr(demo, "root_path", "") or "", dict(headers or {}), getattr(client, "host", None))
    return policy_for(why)


def engine_defaults(policy: EnginePolicy | None = None) -> tuple[str, bool, str]:
    """URL, chat and status at page load: the engine ``engine start`` launched, if one runs now and may be used,
    else the first listed URL. Nothing is fetched (and nothing at all is offered when the policy is closed)."""
    policy = policy or tab_policy()
    if policy.closed:
        return "", False, f"⚠ {policy.closed_message()}"
    url = default_url()
    if url is not None and (policy.loopback or policy.listed):  # started here: loopback, and listed once any is
        engine = engine_at(url)
        return url, bool(engine and engine.chat), f"Engine found: {_label(url, url)} at {url}."
    if policy.listed:
        return policy.listed[0], False, f"Engines this app may use: {', '.join(policy.listed)}."
    return "", False, NO_ENGINE


def chat_for(url: str) -> Any:
    """An instruct preset started here gets chat requests; any other URL keeps the checkbox as it is."""
    engine = engine_at(url or "")
    return gr.update(value=engine.chat) if engine else gr.skip()


def _label(url: str, fallback: str) -> str:
    engine = engine_at(url)
    if engine is None:
        return fallback
    return f"{engine.preset} spec={engine.spec}" + (f" γ={engine.gamma}" if engine.gamma else "")


def _parse_prompts(text: str) -> list[Prompt]:
    if not (text or "").strip():
        raise ExplorerError("the prompts box is empty: one prompt a line (or JSONL with a \"prompt\" field)")
    prompts = parse_prompts(text, "the prompts box")
    if len(prompts) > MAX_PROMPTS:
        raise ExplorerError(f"{len(prompts)} prompts; the tab takes at most {MAX_PROMPTS}")
    return prompts


def prepare_workload(url: str, compare: str, prompts_text: str, concurrency: str, repeats: int, max_tokens: int,
                     chat: bool, policy: EnginePolicy) -> tuple[list[Target], list[Prompt], list[int], str | None]:
    """Every input checked (the URLs against ``policy``) and every server asked for its model before anything is
    sent (one ExplorerError)."""
    first = policy.check_url(url)
    pairs = [(_label(first, "server"), first)]
    if (compare or "").strip():
        other = policy.check_url(compare, "the compare URL")
        label = _label(other, "compare")
        pairs.append((label if label != pairs[0][0] else f"{label} ({other})", other))
    prompts, concurrencies = _parse_prompts(prompts_text), parse_concurrency(concurrency, MAX_CONCURRENCY)
    if int(repeats) < 1 or int(max_tokens) < 1:
        raise ExplorerError("repeats and max tokens must be at least 1")
    total = len(prompts) * int(repeats) * len(concurrencies) * len(pairs)
    if total > MAX_REQUESTS:
        raise ExplorerError(f"{total} requests asked for (prompts × repeats × concurrencies × servers); the tab sends "
                            f"at most {MAX_REQUESTS}: `python -m explorer engine bench` has no limit")
    targets = resolve_targets(pairs, bool(chat), policy)
    return targets, prompts, concurrencies, (pairs[1][0] if len(pairs) > 1 else None)


# ----------------------------------------------------------------------------------------------
# the workload, live

@dataclass
class _Live:
    """What the worker has finished so far: appended from its thread, read by the handler."""

    records: list[RequestRecord] = field(default_factory=list)
    configs: list[ConfigResult] = field(default_factory=list)
    bench: EngineBench | None = None
    error: str | None = None


def _work(live: _Live, targets: list[Target], prompts: list[Prompt], concurrencies: list[int], repeats: int,
          max_tokens: int, temperature: float, cancel: threading.Event, policy: EnginePolicy) -> None:
    try:
        live.bench = run_bench(targets, prompts, concurrencies, repeats, max_tokens, temperature,
                               on_record=live.records.append, on_config=live.configs.append, cancel=cancel,
                               policy=policy)
    except Exception as exc:  # reported in the status line by the handler
        live.error = str(exc) if isinstance(exc, ExplorerError) else f"{type(exc).__name__}: {exc}"


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def stop_workload(request: gr.Request | None = None) -> None:
    """Stop: the session's workload sends nothing more; the requests in flight finish and are kept."""
    cancel = _CANCELS.get(_session(request))
    if cancel is not None:
        cancel.set()


def run_workload(url: str, compare: str, prompts_text: str, concurrency: str, repeats: int, max_tokens: int,
                 temperature: float, chat: bool, request: gr.Request | None = None,
                 policy: EnginePolicy | None = None) -> Iterator[tuple]:
    """Send the prompts at each concurrency (servers interleaved); yield (status, acceptance over time, e2e
    latency, ITL, table) as requests finish, at most every POLL_S, and once more at the end. Nothing is fetched
    that ``policy`` (default: ``tab_policy`` of the request) refuses."""
    skip = (gr.skip(),) * (len(WORKLOAD_OUTPUTS) - 1)
    policy = policy or tab_policy(None, request)
    try:
        targets, prompts, concurrencies, baseline = prepare_workload(url, compare, prompts_text, concurrency,
                                                                     repeats, max_tokens, chat, policy)
    except ExplorerError as exc:
        yield (f"⚠ {exc}", *skip)
        return
    key, cancel, live = _session(request), threading.Event(), _Live()
    _CANCELS[key] = cancel
    total = len(prompts) * int(repeats) * len(concurrencies) * len(targets)
    worker = threading.Thread(target=_work, args=(live, targets, prompts, concurrencies, int(repeats),
                                                  int(max_tokens), float(temperature), cancel, policy),
                              name="engine-workload", daemon=True)
    started = time.perf_counter()
    worker.start()
    shown = (0, 0)
    try:
        while worker.is_alive():
            worker.join(POLL_S)
            seen = (len(live.records), len(live.configs))
            status = (f"Running: {seen[0]} / {total} requests finished, {time.perf_counter() - started:.1f} s "
                      f"(concurrency {', '.join(map(str, concurrencies))}; servers: "
                      f"{'; '.join(f'{t.label} at {t.url}' for t in targets)}).")
            yield (status, *(_figures(live, targets, baseline) if seen != shown else skip))
            shown = seen
    finally:
        cancel.set()  # Stop, or the page went away: nothing more is sent
        if _CANCELS.get(key) is cancel:
            del _CANCELS[key]
    yield (_final_status(live, total, time.perf_counter() - started), *_figures(live, targets, baseline))


def _final_status(live: _Live, total: int, wall_s: float) -> str:
    n = len(live.records)
    failed = sum(r.error is not None for r in live.records)
    errors = f" {failed} of them failed (see the table's errors column)." if failed else ""
    if live.error is not None:
        return f"⚠ The workload failed: {live.error}. The {n} requests finished before it are shown."
    if live.bench is not None and live.bench.error == "cancelled":
        return f"Stopped: {n} of {total} requests finished in {wall_s:.1f} s; they are kept below.{errors}"
    if live.bench is not None and live.bench.error:
        return (f"⚠ The run ended early: {live.bench.error}. The {n} requests measured before it are kept."
                + errors)
    return (f"Done: {n} request{'s' if n != 1 else ''} in {wall_s:.1f} s.{errors} Acceptance (/metrics) is the "
            "server's own count over each config; tokens/step is inferred from the stream (one chunk = one step).")


def _live_bench(live: _Live, targets: list[Target]) -> tuple[EngineBench, set[tuple[str, int]]]:
    """The finished configs, plus the running one summarized from its finished requests (and which those are)."""
    done = list(live.configs)  # read before the records: a config that ends in between counts as running
    finished = {(c.label, c.concurrency) for c in done}
    running: dict[tuple[str, int], list[RequestRecord]] = {}
    for r in list(live.records):
        if (r.label, r.concurrency) not in finished:
            running.setdefault((r.label, r.concurrency), []).append(r)
    urls = {t.label: t.url for t in targets}
    now = time.time()
    partial = [ConfigResult(label, urls[label], c, recs, wall_s=now - min(r.sent for r in recs))
               for (label, c), recs in running.items()]
    return EngineBench(done + partial), set(running)


def _figures(live: _Live, targets: list[Target], baseline: str | None) -> tuple:
    bench, running = _live_bench(live, targets)
    rows = summary_rows(bench, baseline)
    frame = pd.DataFrame(rows)
    return (*workload_figures(bench.records, frame), workload_table(rows, running))


def workload_figures(records: list[RequestRecord] | None = None, summary: pd.DataFrame | None = None) -> tuple:
    """Acceptance over time, e2e and ITL p50/p99, throughput: the report's figures, titled to fit half a page."""
    summary = pd.DataFrame() if summary is None else summary
    acceptance = acceptance_over_time_figure(records or [])
    acceptance.update_layout(title="Acceptance over time: tokens per engine step")
    acceptance.update_yaxes(title="tokens per step (stream)")
    figures = (acceptance, latency_figure(summary, "e2e", "End-to-end latency: p50, p99"),
               latency_figure(summary, "itl", "Inter-chunk latency (ITL): p50, p99"), throughput_figure(summary))
    for fig in figures:  # room for the legend under the axis title
        fig.update_layout(height=420, margin={"b": 120}, legend={"y": -0.45})
    return figures


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "–"
    return fmt.format(value) if math.isfinite(value) else "–"


def batch_cell(row: dict[str, Any]) -> str:
    """The batch the engine ran: the most token streams that overlapped in time (from the stream's own stamps,
    ``bench.max_streaming``), with its mean beside it: Little's law on the engine's clock (``engine_batch``), or the
    polled vllm:num_requests_running gauge's mean where the server does not time its requests."""
    streams = row.get("max_streaming")
    engine = _num(row.get("engine_batch"), "{:.1f}")
    mean = f"mean {engine}" if engine != "–" else f"gauge {_num(row.get('mean_running'), '{:.1f}')}"
    return f"{int(streams)} ({mean})" if isinstance(streams, (int, float)) and streams == streams else mean


def workload_table(rows: list[dict[str, Any]], running: set[tuple[str, int]] = frozenset()) -> pd.DataFrame:
    """The summary rows as a compact table of strings; a running config's row covers its finished requests."""
    out = []
    for r in rows:
        live = (r["label"], r["concurrency"]) in running
        acceptance = r.get("acceptance")
        if live:
            acceptance = "at the end"
        elif isinstance(acceptance, float):
            acceptance = _num(acceptance * 100, "{:.0f}%")
        out.append({"server": r["label"], "c": r["concurrency"], "state": "running" if live else "done",
                    "n": r["requests"], "errors": r["errors"], "tok/s": _num(r["throughput_tok_s"], "{:.1f}"),
                    "e2e p50": _num(r["e2e_p50_ms"]), "e2e p99": _num(r["e2e_p99_ms"]),
                    "ITL p50": _num(r["itl_p50_ms"], "{:.1f}"), "ITL p99": _num(r["itl_p99_ms"], "{:.1f}"),
                    "TTFT p99": _num(r["ttft_p99_ms"]), "batch": batch_cell(r),
                    "tok/step": _num(r["tokens_per_chunk_inferred"], "{:.2f}"), "acceptance": acceptance,
                    "gain": _num(r.get("speedup_throughput"), "{:.2f}×")})
    return pd.DataFrame(out, columns=TABLE_COLUMNS)


# ----------------------------------------------------------------------------------------------
# layout and wiring

def build_engine_tab(demo: gr.Blocks, speed: Any) -> None:
    """The tab's components and events (inside ``with gr.Tab(...)``); ``speed`` paces the compare playback."""
    gr.Markdown(read_text("engine.md"), elem_id="engine-intro")
    with gr.Row():
        url = gr.Textbox(label="Engine URL", placeholder="http://127.0.0.1:8011 (python -m explorer engine start)",
                         scale=3, elem_id="engine-url")
        compare = gr.Textbox(label="Compare URL (optional)", placeholder="e.g. the same model with speculation off",
                             scale=3, elem_id="engine-compare")
        chat = gr.Checkbox(False, label="chat", info="/v1/chat/completions (instruct models)", scale=1,
                           min_width=120)
    with gr.Row():
        prompts = gr.Textbox(DEFAULT_PROMPTS, label="Prompts (one a line, or JSONL)", lines=5, max_lines=12, scale=3,
                             elem_id="engine-prompts")
        with gr.Column(scale=2):
            concurrency = gr.Textbox("1,2,4", label="Concurrency (requests in flight, comma-separated)")
            with gr.Row():
                repeats = gr.Number(1, precision=0, minimum=1, maximum=20, label="repeats", min_width=80)
                max_tokens = gr.Number(48, precision=0, minimum=1, maximum=1024, label="max tokens", min_width=80)
                temperature = gr.Number(0.0, minimum=0, maximum=2, step=0.1, label="temperature", min_width=80)
            with gr.Row():
                run = gr.Button("▶ Run workload", variant="primary", elem_id="engine-run")
                stop = gr.Button("■ Stop", variant="stop", elem_id="engine-stop")
    status = gr.Markdown(NO_ENGINE, elem_id="engine-status")
    figures, plots = dict(zip(WORKLOAD_OUTPUTS[1:5], workload_figures(), strict=True)), []
    for pair in (WORKLOAD_OUTPUTS[1:3], WORKLOAD_OUTPUTS[3:5]):
        with gr.Row():
            plots += [gr.Plot(figures[name], label=name, elem_classes=["explorer-plot"], elem_id=f"engine-{name}")
                      for name in pair]
    table = gr.Dataframe(workload_table([]), label="Per server and concurrency: latencies in ms; batch = the most "
                         "token streams that overlapped (the polled gauge's mean beside it); tok/step inferred "
                         "from the stream, acceptance from /metrics; a running row covers its finished requests",
                         interactive=False, wrap=True, elem_id="engine-table",
                         column_widths=["15%", "4%", "7%", "4%", "6%", "6%", "6%", "6%", "6%", "6%", "6%", "6%", "7%",
                                        "9%", "6%"])
    gr.Markdown("### Compare one request\nThe engine streams it; the explorer decodes it with its own speculative "
                "decoder (same preset, drafter and γ as the engine where it knows them). Then both play on one "
                "clock, paced by the sidebar's Playback.")
    with gr.Row():
        one_prompt = gr.Textbox("def read_config(path):", label="Prompt", lines=2, scale=4, elem_id="engine-prompt")
        one_run = gr.Button("Compare", variant="primary", scale=1, elem_id="engine-compare-run")
    one_status = gr.Markdown("", elem_id="engine-compare-status")
    frame = gr.HTML(compare_frame(None), css_template=STYLE, apply_default_css=False, elem_id="engine-lanes")

    _wire(demo, run, stop, one_run, [url, compare, prompts, concurrency, repeats, max_tokens, temperature, chat],
          [url, one_prompt, max_tokens, temperature, chat, speed], [status, *plots, table], [frame, one_status])
    url.blur(chat_for, url, chat, queue=False, api_visibility="undocumented", show_progress="hidden")

    def defaults(request: gr.Request) -> tuple[str, bool, str]:
        return engine_defaults(tab_policy(demo, request))

    demo.load(defaults, None, [url, chat, status], api_visibility="undocumented", queue=False)


def _wire(demo: gr.Blocks, run: gr.Button, stop: gr.Button, one_run: gr.Button, workload_in: list, compare_in: list,
          workload_out: list, compare_out: list) -> None:
    """The handlers, each given the policy of this app (``demo``: how it was launched) and the visitor's request."""

    def engine_workload(url: str, compare: str, prompts_text: str, concurrency: str, repeats: int, max_tokens: int,
                        temperature: float, chat: bool, request: gr.Request) -> Iterator[tuple]:
        yield from run_workload(url, compare, prompts_text, concurrency, repeats, max_tokens, temperature, chat,
                                request, tab_policy(demo, request))

    def engine_compare(url: str, prompt: str, max_tokens: int, temperature: float, chat: bool, speed: float,
                       request: gr.Request) -> Iterator[tuple[str, str]]:
        with DECODES.held("engine comparison"):  # it decodes the explorer's side too
            yield from compare_one(url, prompt, max_tokens, temperature, chat, speed, tab_policy(demo, request))

    run.click(engine_workload, workload_in, workload_out, api_name="engine_workload", show_progress="hidden",
              concurrency_id="engine", concurrency_limit=1)
    stop.click(stop_workload, None, None, queue=False, api_visibility="undocumented")
    one_run.click(engine_compare, compare_in, compare_out, api_name="engine_compare", show_progress="hidden",
                  concurrency_id="decode", concurrency_limit=1)
