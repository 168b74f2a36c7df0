"""Animation frames: events -> HTML strings, one lane per decoding method.

Pure functions, no Gradio: the UI calls them with the events recorded so far (live) or with
the events of a finished trace up to a replay time. Every piece of model or user text goes
through ``html.escape``; whitespace and control characters are made visible. Each token
state has a CSS class *and* a text marker (never colour alone); hovering shows the numbers
(p, q, min(1, p/q) for drafts; step and confidence for diffusion reveals).
"""

from __future__ import annotations

import bisect
import html
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from explorer.app.diffusion_view import diffusion_body, diffusion_canvas  # noqa: F401 (render.diffusion_canvas)
from explorer.app.headers import lane_detail
from explorer.app.tree_view import is_tree, tree_step_html
from explorer.decoding.events import Event, Proposal, RefinementStep, TokenStep, Trace, Verification

Piece = Callable[[int], str]  # token id -> its text
STATUSES = ("waiting", "running", "done", "stopped", "error")

LANE_TITLES = {"autoregressive": "Autoregressive (reference)", "speculative": "Speculative decoding",
               "diffusion": "Masked diffusion"}
PROMPT_TAIL_CHARS, PROMPT_TAIL_LINES = 160, 3  # how much of the prompt each lane repeats

# state -> (css class, text marker, legend text)
MARKS = {
    "target": ("tgt", "", "target token (one pass each)"),
    "pending": ("pend", "?", "drafted, waiting for the target"),
    "accepted": ("acc", "✓", "draft accepted"),
    "rejected": ("rej", "✗", "draft rejected (struck through)"),
    "discarded": ("skip", "⊘", "draft after a rejection, discarded unchecked"),
    "resampled": ("res", "↻", "resampled by the target after a rejection"),
    "bonus": ("bon", "★", "bonus token (every draft accepted)"),
    "mask": ("mask", "", "[MASK], not yet revealed"),
    "new": ("new", "●", "revealed at this step (green)"),
    "revealed": ("old", "", "committed earlier (underline = confidence)"),
    "revoked": ("rej", "↺", "masked again by this step (struck through; sampler revoke)"),
}


@dataclass(frozen=True)
class LaneView:
    """What one lane shows: the method, the events so far and how to label them."""

    method: str
    events: Sequence[Event]
    prompt: str
    piece: Piece
    max_new_tokens: int
    block_length: int | None = None  # diffusion: None means one block
    clock_s: float = 0.0  # decoder time shown in the header
    status: str = "running"  # one of STATUSES
    detail: str = ""  # e.g. "model drafter, γ=4"
    note: str = ""  # one line under the header: decode progress, an error, why a lane waits
    progress: float | None = None  # 0..1 while the decoder runs alone (a bar instead of tokens)
    total_steps: int | None = None  # steps of the finished decode (the narration says "step i of n")
    options: Mapping[str, Any] = field(default_factory=dict)  # the decode's options (the narration reads these)


def token_piece(tokenizer: Any) -> Piece:
    """A cached id -> text function (special tokens kept, so EOS shows up).

    A byte-level token holding part of a UTF-8 character decodes to U+FFFD; show its bytes
    instead (``\\xc3``), so a character split over two tokens is visible as such.
    """

    @lru_cache(maxsize=65536)
    def piece(token_id: int) -> str:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            raw = tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(raw, str) and raw and all(ch in BYTE_DECODER for ch in raw):
                return bytes(BYTE_DECODER[ch] for ch in raw).decode("utf-8", errors="backslashreplace")
        return text

    piece.end_id = getattr(tokenizer, "eos_token_id", None)  # the diffusion lane folds what follows it
    return piece


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in character -> its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


BYTE_DECODER = _byte_decoder()


def visible_html(text: str) -> str:
    """Escape ``text`` for HTML and make whitespace and control characters visible."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append('<span class="ws">↵</span>')
        elif ch == "\t":
            out.append('<span class="ws">⇥</span>')
        elif ch == " ":
            out.append('<span class="ws">·</span>')
        elif ch == "\r":
            out.append('<span class="ws">␍</span>')
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f'<span class="ws">\\x{ord(ch):02x}</span>')
        else:
            out.append(html.escape(ch))
    return "".join(out) or '<span class="ws">∅</span>'


def _chip(piece: str, state: str, title: str, extra_class: str = "", style: str = "") -> str:
    css, marker, _ = MARKS[state]
    mark = f'<span class="mk">{marker}</span>' if marker else ""
    style_attr = f' style="{style}"' if style else ""
    return (f'<span class="tok {css}{extra_class}" title="{html.escape(title, quote=True)}"{style_attr}>'
            f"{visible_html(piece)}{mark}</span>")


def legend_html(methods: Sequence[str] = ("autoregressive", "speculative", "diffusion")) -> str:
    """The legend: a sample chip per state, marker and words (not colour alone)."""
    states = ["target"] if "autoregressive" in methods else []
    if "speculative" in methods:
        states += ["pending", "accepted", "rejected", "discarded", "resampled", "bonus"]
    if "diffusion" in methods:
        states += ["mask", "new", "revealed", "revoked"]
    items = []
    for state in states:
        css, marker, words = MARKS[state]
        sample = "" if state == "mask" else "tok"
        mark = f'<span class="mk">{marker}</span>' if marker else ""
        items.append(f'<span class="legend-item"><span class="tok {css}">{sample}{mark}</span> '
                     f"{html.escape(words)}</span>")
    if "diffusion" in methods:
        items.append('<span class="legend-item"><span class="blocksep-sample">┃</span> block boundary</span>')
    items.append('<span class="legend-item"><span class="ws">·</span> space <span class="ws">↵</span> newline '
                 '<span class="ws">⇥</span> tab</span>')
    return f'<div class="legend" role="list">{"".join(items)}</div>'


# ----------------------------------------------------------------------------------------------
# lane bodies

def _prompt_html(prompt: str) -> str:
    """The end of the prompt (its last lines), dimmed, as context for the new tokens."""
    lines = prompt.split("\n")
    tail = "\n".join(lines[-PROMPT_TAIL_LINES:])[-PROMPT_TAIL_CHARS:]
    cut = "…" if len(tail) < len(prompt) else ""
    return f'<span class="prompt" title="the end of the prompt">{cut}{html.escape(tail)}</span>'


def _autoregressive_body(view: LaneView) -> str:
    chips = [_chip(view.piece(e.token), "target", f"step {e.step + 1} · p = {e.p:.3f}")
             for e in view.events if isinstance(e, TokenStep)]
    return "".join(chips)


def _verification_chips(proposal: Proposal | None, ver: Verification, piece: Piece) -> tuple[list[str], list[str]]:
    """(kept, dropped): the tokens the step appended, and the drafts it rejected or discarded."""
    drafted = proposal.tokens if proposal is not None else ()
    kept_n = len(ver.emitted)
    kept, dropped = [], []
    for check in ver.checks:
        numbers = f"p = {check.p:.3f} · q = {check.q:.3f} · min(1, p/q) = {check.accept_prob:.3f}"
        if check.accepted and check.position < kept_n:
            kept.append(_chip(piece(check.token), "accepted", f"draft {check.position + 1} accepted · {numbers}"))
        elif check.accepted:
            dropped.append(_chip(piece(check.token), "discarded", f"accepted but cut (EOS / length) · {numbers}"))
        else:
            dropped.append(_chip(piece(check.token), "rejected", f"draft {check.position + 1} rejected · {numbers}"))
    for i in range(len(ver.checks), len(drafted)):
        dropped.append(_chip(piece(drafted[i]), "discarded", f"draft {i + 1}: after a rejection, never checked"))
    if kept_n == ver.accepted + 1:
        if ver.resampled is not None:
            kept.append(_chip(piece(ver.resampled), "resampled", "drawn by the target from norm(max(0, p − q))"))
        elif ver.bonus is not None and drafted:
            title = "bonus: drawn from the target's next distribution (all drafts accepted)"
            kept.append(_chip(piece(ver.bonus), "bonus", title))
        elif ver.bonus is not None:  # nothing was drafted (e.g. no n-gram match): a plain target token
            kept.append(_chip(piece(ver.bonus), "target", "target token (nothing drafted this step)"))
    return kept, dropped


def _step_box(kept: list[str], dropped: list[str], title: str, extra: str = "") -> str:
    """One verify step: the kept tokens flow on top, the rejected/discarded drafts in a small row under them."""
    under = f'<span class="dropped">{"".join(dropped)}</span>' if dropped else ""
    return (f'<span class="step{extra}" title="{html.escape(title, quote=True)}">'
            f'<span class="kept">{"".join(kept) or "&#8203;"}</span>{under}</span>')


def _speculative_body(view: LaneView) -> str:
    parts, proposal, passes = [], None, 0
    for e in view.events:
        if isinstance(e, Proposal):
            proposal = e
        elif isinstance(e, Verification):
            passes += 1
            kept, dropped = _verification_chips(proposal, e, view.piece)
            title = f"target pass {passes}: kept {len(e.emitted)} token(s)"
            parts.append(tree_step_html(proposal, e, view.piece, kept, title, _chip) if is_tree(proposal)
                         else _step_box(kept, dropped, title))
            proposal = None
    if is_tree(proposal):  # a drafted tree, not yet verified
        parts.append(tree_step_html(proposal, None, view.piece, [], "drafted, waiting for the target's pass", _chip))
    elif proposal is not None:  # drafted, not yet verified
        pending = [_chip(view.piece(tok), "pending", f"draft {i + 1} · q = {q:.3f} (waiting for the target)")
                   for i, (tok, q) in enumerate(zip(proposal.tokens, proposal.q, strict=True))]
        parts.append(_step_box(pending, [], "drafted, waiting for the target's pass", " pending"))
    if parts:  # the latest step is the one the narration talks about
        parts[-1] = parts[-1].replace('<span class="step', '<span class="step last', 1)
    return "".join(parts)


def _diffusion_body(view: LaneView) -> str:
    return diffusion_body(view, _chip)


# ----------------------------------------------------------------------------------------------
# headers and lanes

def lane_counts(method: str, events: Sequence[Event], max_new_tokens: int) -> dict[str, Any]:
    """Counters for a lane header, computed from the events shown so far."""
    if method == "autoregressive":
        n = sum(isinstance(e, TokenStep) for e in events)
        return {"tokens": n, "target_passes": n}
    if method == "speculative":
        target = sum(isinstance(e, Verification) for e in events)  # the first verify pass is the prefill
        draft = sum(e.draft_passes for e in events if isinstance(e, Proposal))
        ver = [e for e in events if isinstance(e, Verification)]
        drafted = {e.step: len(e.tokens) for e in events if isinstance(e, Proposal)}
        proposed = sum(drafted.get(v.step, 0) for v in ver)
        accepted = sum(v.accepted for v in ver)
        return {"tokens": sum(len(v.emitted) for v in ver), "target_passes": target, "draft_passes": draft,
                "acceptance_rate": accepted / proposed if proposed else None}
    steps = [e for e in events if isinstance(e, RefinementStep)]
    return {"tokens": sum(len(e.positions) - len(e.remasked) for e in steps), "target_passes": len(steps),
            "masks_left": steps[-1].masks_left if steps else max_new_tokens}


def _header(view: LaneView, counts: dict[str, Any]) -> str:
    passes = counts["target_passes"]
    per_pass = f"{counts['tokens'] / passes:.2f}" if passes else "–"
    pass_word = "denoiser passes" if view.method == "diffusion" else "target passes"
    bits = [f'<span class="clock" title="decoder clock: time since this decoder started">'
            f"clock {view.clock_s:.3f} s</span>",
            f"<span>{passes} {pass_word}</span>", f"<span>{per_pass} tokens/pass</span>",
            f"<span>{counts['tokens']} tokens</span>"]
    if view.method == "speculative":
        bits.insert(2, f"<span>{counts['draft_passes']} draft passes</span>")
        rate = counts["acceptance_rate"]
        bits.append(f"<span>acceptance {rate:.0%}</span>" if rate is not None else "<span>acceptance –</span>")
    if view.method == "diffusion":
        bits.append(f'<span class="masks-left">{counts["masks_left"]} / {view.max_new_tokens} masks left</span>')
    detail = f' <span class="detail">{html.escape(view.detail)}</span>' if view.detail else ""
    return (f'<div class="lane-head"><div class="lane-title">{LANE_TITLES[view.method]}{detail}'
            f' <span class="status">{STATUS_TEXT[view.status]}</span></div>'
            f'<div class="lane-stats">{" · ".join(bits)}</div></div>')


STATUS_TEXT = {"waiting": "waiting", "running": "running", "done": "done", "stopped": "stopped", "error": "error"}


def _progress_html(view: LaneView) -> str:
    """While the decoder runs alone: a bar and how far it is (no tokens: they play on the shared clock)."""
    share = max(0.0, min(1.0, view.progress or 0.0))
    return (f'<div class="decoding" role="progressbar" aria-valuenow="{share * 100:.0f}" aria-valuemin="0" '
            f'aria-valuemax="100"><div class="bar" style="width:{share * 100:.1f}%"></div></div>')


def lane_html(view: LaneView) -> str:
    """One lane: header (clock, passes, tokens per pass), a note, and the body at the events given."""
    if view.status not in STATUSES:
        raise ValueError(f"unknown lane status {view.status!r}")
    counts = lane_counts(view.method, view.events, view.max_new_tokens)
    body = {"autoregressive": _autoregressive_body, "speculative": _speculative_body,
            "diffusion": _diffusion_body}[view.method](view)
    if view.method == "diffusion":
        prompt = f'<div class="prompt-line">{_prompt_html(view.prompt)}</div>'
    else:
        prompt = _prompt_html(view.prompt)
    progress = _progress_html(view) if view.progress is not None else ""
    note = f'<div class="note">{html.escape(view.note)}</div>' if view.note else ""
    masks = f' data-masks-left="{counts["masks_left"]}"' if view.method == "diffusion" else ""
    # the body scrolls inside a bounded height; its inner box keeps the newest tokens in view
    return (f'<section class="lane lane-{view.method}" data-lane="{view.method}" data-method="{view.method}"'
            f' data-status="{view.status}" data-tokens="{counts["tokens"]}"{masks}>{_header(view, counts)}'
            f'{note}{progress}<div class="lane-body"><div class="lane-inner">{prompt}{body}</div></div></section>')


def burst_lane_html(title: str, detail: str, prompt: str, steps: Sequence[tuple[int, Sequence[str]]],
                    clock_s: float, status: str, note: str = "") -> str:
    """A streamed request as a lane (an engine's): one box per chunk, that is per engine step. ``steps`` holds
    (tokens, pieces) per chunk: one piece per token when a tokenizer split them, else the chunk's text as one.
    The stream shows only how many tokens a step added, so a step of k tokens reads as k − 1 accepted drafts
    and then the target's own token (a correction or a bonus: the stream does not say which); the first chunk
    is the prefill's token."""
    if status not in STATUSES:
        raise ValueError(f"unknown lane status {status!r}")
    boxes = []
    for i, (k, pieces) in enumerate(steps):
        what = "the prefill's token" if i == 0 else f"{k - 1} draft(s) accepted, inferred from the stream"
        if len(pieces) == k:
            chips = [_chip(p, "accepted", f"step {i + 1}: draft {j + 1} accepted (inferred from the stream)")
                     for j, p in enumerate(pieces[:-1])]
            chips.append(_chip(pieces[-1], "target", f"step {i + 1}: the target's own token"))
        else:
            chips = [_chip("".join(pieces), "accepted" if k > 1 else "target", f"step {i + 1}: {k} token(s)")]
        boxes.append(_step_box(chips, [], f"engine step {i + 1}: {k} token(s), {what}"))
    if boxes:
        boxes[-1] = boxes[-1].replace('<span class="step', '<span class="step last', 1)
    tokens = sum(k for k, _ in steps)
    accepted = sum(k - 1 for k, _ in steps[1:])
    per_step = f"{tokens / len(steps):.2f}" if steps else "–"
    bits = [f'<span class="clock" title="time since the request was sent">clock {clock_s:.3f} s</span>',
            f"<span>{len(steps)} engine steps</span>", f"<span>{per_step} tokens/step</span>",
            f"<span>{tokens} tokens</span>", f"<span>{accepted} drafts accepted (inferred)</span>"]
    head = (f'<div class="lane-head"><div class="lane-title">{html.escape(title)} <span class="detail">'
            f'{html.escape(detail)}</span> <span class="status">{STATUS_TEXT[status]}</span></div>'
            f'<div class="lane-stats">{" · ".join(bits)}</div></div>')
    note = f'<div class="note">{html.escape(note)}</div>' if note else ""
    return (f'<section class="lane lane-engine" data-lane="engine" data-status="{status}" data-tokens="{tokens}" '
            f'data-steps="{len(steps)}">{head}{note}<div class="lane-body"><div class="lane-inner">'
            f'{_prompt_html(prompt)}{"".join(boxes)}</div></div></section>')


def lanes_html(lanes: Sequence[str], methods: Sequence[str], caption: str = "", narration: str = "",
               below: str = "") -> str:
    """Lanes side by side (one column each) under the legend; the narration beside them; ``below``
    (the live mini-plots) under them."""
    cap = f'<div class="frame-caption">{html.escape(caption)}</div>' if caption else ""
    story = f'<aside class="narration" id="narration" aria-live="polite">{narration}</aside>' if narration else ""
    return (f'<div class="explorer-frame" style="--lanes:{max(1, len(lanes))}">{legend_html(methods)}'
            f'<div class="stage"><div class="lanes">{"".join(lanes)}</div>{story}</div>{cap}{below}</div>')


# ----------------------------------------------------------------------------------------------
# finished traces: replay on a shared clock

def event_offsets(trace: Trace) -> list[float]:
    """Seconds after the trace's start at which each event happened."""
    return [e.t - trace.t0 for e in trace.events]


def events_until(trace: Trace, at_s: float) -> list[Event]:
    """The events of ``trace`` that had happened ``at_s`` seconds after it started."""
    return trace.events[: bisect.bisect_right(event_offsets(trace), at_s)]


def trace_view(trace: Trace, piece: Piece, at_s: float | None = None, detail: str = "",
               unfinished: str = "running") -> LaneView:
    """A finished trace as a lane, at replay time ``at_s`` (None: the end); a lane not finished at
    ``at_s`` gets the status ``unfinished`` ("running" while playing, "stopped" on a paused frame)."""
    wall = float(trace.stats["wall_s"])
    at = wall if at_s is None else max(0.0, at_s)
    events = trace.events if at >= wall else events_until(trace, at)
    cfg = trace.config
    return LaneView(trace.method, events, trace.prompt, piece, int(cfg["max_new_tokens"]),
                    cfg.get("block_length"), clock_s=min(at, wall), status="done" if at >= wall else unfinished,
                    detail=detail or lane_detail(trace.method, cfg), total_steps=total_steps(trace), options=cfg)


def total_steps(trace: Trace) -> int | None:
    """Verify steps (speculative) or refinement steps (diffusion) of a finished trace; None for AR."""
    kind = {"speculative": Verification, "diffusion": RefinementStep}.get(trace.method)
    return sum(isinstance(e, kind) for e in trace.events) if kind else None


def next_event_time(traces: Sequence[Trace], at_s: float, backwards: bool = False) -> float:
    """The replay's step buttons: the next event time after ``at_s`` across all traces, or
    (backwards) the time of the event before the latest one shown at ``at_s``."""
    times = sorted({off for tr in traces for off in event_offsets(tr)})
    if backwards:
        shown = [t for t in times if t <= at_s + 1e-9]
        return shown[-2] if len(shown) >= 2 else 0.0
    later = [t for t in times if t > at_s + 1e-9]
    return later[0] if later else (times[-1] if times else 0.0)


