"""The Engine tab's "Compare one request": one streamed request on the engine, then the explorer's own speculative
decode of the same prompt, both played on one clock with the engine's real chunk timestamps (one box per engine
step). Every fetch goes through the tab's ``EnginePolicy`` (explorer/engine/allow.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

import explorer
from explorer.app import narration, render
from explorer.app.lane_settings import load_preset
from explorer.app.playback import playback_times, speed_words
from explorer.decoding.prompting import validate_prompt
from explorer.engine.allow import EnginePolicy, environment_policy
from explorer.engine.client import RequestRecord, run_one, served_model
from explorer.engine.server import ENGINE_PRESETS, engine_at
from explorer.errors import ExplorerError

DRAFTER_FOR_SPEC = {"ngram": "prompt_lookup", "draft": "model"}  # vLLM's method -> the explorer's drafter


@dataclass
class _Pair:
    """One compared request: the engine's record (with its steps as chips) and the explorer's trace, if any."""

    prompt: str
    record: RequestRecord
    steps: list[tuple[float, int, list[str]]]  # (seconds after sending, tokens, pieces) per chunk with tokens
    detail: str
    trace: Any = None
    piece: render.Piece | None = None
    note: str = ""

    @property
    def end_s(self) -> float:
        return max(self.record.done or 0.0, float(self.trace.stats["wall_s"]) if self.trace else 0.0)


def _steps(record: RequestRecord, piece: render.Piece | None) -> list[tuple[float, int, list[str]]]:
    """Chunks with tokens; split into token pieces when the server sent ids for every token and we can read them."""
    chunks = [c for c in record.chunks if c.tokens > 0]
    ids = list(record.token_ids or [])
    split = piece is not None and len(ids) == sum(c.tokens for c in chunks)
    out, at = [], 0
    for c in chunks:
        pieces = [piece(i) for i in ids[at:at + c.tokens]] if split else [c.text]
        out.append((c.t, c.tokens, pieces))
        at += c.tokens
    return out


def _engine_narration(pair: _Pair, shown: list[tuple[float, int, list[str]]]) -> str:
    if not shown:
        text = "Nothing streamed yet: the engine reads the prompt (prefill) and sends the first token."
    else:
        _, k, pieces = shown[-1]
        quoted = " ".join(f"<code>{render.visible_html(p)}</code>" for p in pieces)
        text = (f"Step {len(shown)}: one chunk of {k} token(s), {quoted}"
                + ("; the prefill's token." if len(shown) == 1 else
                   f": {k - 1} draft(s) accepted and the target's own token, inferred from the stream."))
    return f'<p class="narr narr-engine" data-lane="engine"><b>vLLM engine.</b> {text}</p>'


def compare_frame(pair: _Pair | None, at_s: float | None = None, caption: str = "") -> str:
    """Both lanes as they were ``at_s`` seconds after each started (None: the end)."""
    if pair is None:
        lane = render.burst_lane_html("vLLM engine", "", "", [], 0.0, "waiting", "press Compare")
        return render.lanes_html([lane], ["autoregressive", "speculative"], caption)
    end = pair.end_s if at_s is None else at_s
    lanes, views = [], []
    if pair.trace is not None:
        view = render.trace_view(pair.trace, pair.piece, end, unfinished="running")
        lanes.append(render.lane_html(view))
        views.append(view)
    shown = [s for s in pair.steps if s[0] <= end]
    done = end >= (pair.record.done or 0.0)
    lanes.append(render.burst_lane_html("vLLM engine", pair.detail, pair.prompt, [(k, p) for _, k, p in shown],
                                        min(end, pair.record.done or 0.0), "done" if done else "running", pair.note))
    story = (narration.narration_html(views) if views else '<div class="narr-title">What just happened</div>')
    return render.lanes_html(lanes, ["autoregressive", "speculative"], caption, story + _engine_narration(pair, shown))


def compare_one(url: str, prompt: str, max_tokens: int, temperature: float, chat: bool, speed: float,
                policy: EnginePolicy | None = None) -> Iterator[tuple[str, str]]:
    """One streamed request on the engine, then the explorer's speculative decode of the same prompt (each
    alone), then both played on one clock with the real chunk timestamps. Yields (frame, status). Nothing is
    fetched that ``policy`` (default: the one the environment gives, see ``allow.environment_policy``) refuses."""
    policy = policy or environment_policy()
    try:
        url, prompt = policy.check_url(url), validate_prompt(prompt)
        model = served_model(url, policy=policy)
    except ExplorerError as exc:
        yield gr.skip(), f"⚠ {exc}"
        return
    engine = engine_at(url)
    preset = engine.preset if engine else (model if model in ENGINE_PRESETS else None)
    models, note = None, ""
    if preset is None:
        note = (f"The server runs {model!r}, not an explorer preset ({', '.join(ENGINE_PRESETS)}): "
                "only its lane is shown.")
    else:
        yield compare_frame(None, caption="Loading the explorer's models …"), f"Loading preset {preset} …"
        try:
            models = load_preset(preset)
        except gr.Error as exc:
            note = f"The explorer could not load {preset}: {exc.message}; only the engine's lane is shown."
    chat = models.preset.chat if models is not None else bool(chat)  # both lanes read the same prompt format
    yield gr.skip(), "Sending the request to the engine (alone, streamed) …"
    record = run_one(url, prompt, int(max_tokens), float(temperature), chat, model=model, want_ids=True,
                     policy=policy)
    if record.error:
        yield gr.skip(), f"⚠ the engine's request failed: {record.error}"
        return
    spec = engine.spec if engine else "unknown"
    detail = f"{model}, spec {spec}" + (f", γ = {engine.gamma}" if engine and engine.gamma else "") + \
        (", chat" if chat else "")
    pair = _Pair(prompt, record, [], detail, note=note)
    if models is not None:
        yield gr.skip(), "Decoding the same prompt with the explorer's speculative decoder (alone, timed) …"
        options = {"max_new_tokens": int(max_tokens), "temperature": float(temperature),
                   "drafter": DRAFTER_FOR_SPEC.get(spec, models.preset.drafter),
                   "gamma": engine.gamma if engine and engine.gamma else models.preset.gamma}
        try:
            pair.trace = explorer.decode("speculative", models, prompt, **options)
            pair.piece = render.token_piece(models.tokenizer)
        except ExplorerError as exc:
            pair.note = f"The explorer's lane failed: {exc}"
    pair.steps = _steps(record, pair.piece)
    end_ms = pair.end_s * 1e3
    words = speed_words(end_ms, speed)
    for at in playback_times(end_ms, speed):
        yield compare_frame(pair, at / 1e3, f"Both lanes on one clock, t = {at:.1f} ms ({words})."), gr.skip()
    yield compare_frame(pair, None, _compare_caption(pair, words)), _compare_status(pair)


def _compare_caption(pair: _Pair, words: str) -> str:
    r = pair.record
    text = (f"Played on one clock ({words}). Engine: {r.tokens} tokens in {len(pair.steps)} steps, "
            f"{(r.done or 0) * 1e3:.0f} ms (first token {(r.ttft_s or 0) * 1e3:.0f} ms, HTTP included).")
    if pair.trace is not None:
        s = pair.trace.stats
        text += (f" Explorer: {s['new_tokens']} tokens in {s['target_forward_passes']} target passes, "
                 f"{s['wall_s'] * 1e3:.0f} ms (PyTorch, batch 1, in this process).")
    return text


def _compare_status(pair: _Pair) -> str:
    """Done, and at temperature 0 whether the engine's tokens equal the explorer's."""
    if pair.trace is None or pair.trace.config["temperature"] != 0 or not pair.record.token_ids:
        return "Done."
    engine, mine = list(pair.record.token_ids), list(pair.trace.token_ids)
    n = min(len(engine), len(mine))
    if engine[:n] == mine[:n]:
        return f"Done. Greedy: the engine's tokens equal the explorer's ({n} compared)."
    first = next(i for i in range(n) if engine[i] != mine[i])
    return f"Done. Greedy: the engine's tokens differ from the explorer's from token {first + 1} on."
