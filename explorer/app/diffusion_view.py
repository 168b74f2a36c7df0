"""The diffusion lane's body: every output position as a mask or the token revealed there, in blocks filled left to
right; a character over several byte tokens as one chip (``byte_chips``); and everything after the answer's end as
one quiet "(end of answer)" marker, never a wall of end-of-turn chips or of masks that will never matter."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

from explorer.app import byte_chips
from explorer.decoding.events import Event, RefinementStep

END_MARK = "(end of answer)"


def diffusion_canvas(events: Sequence[Event], size: int) -> list[tuple[int, float, int] | None]:
    """Per output position: None while masked, else (token, confidence, step it was revealed at). A step's
    re-masked positions (sampler revoke) are masked before its revealed ones are written."""
    canvas: list[tuple[int, float, int] | None] = [None] * size
    for e in events:
        if isinstance(e, RefinementStep):
            for pos in e.remasked:
                if 0 <= pos < size:
                    canvas[pos] = None
            for pos, tok, conf in zip(e.positions, e.tokens, e.confidences, strict=True):
                if 0 <= pos < size:
                    canvas[pos] = (tok, conf, e.step)
    return canvas


def answer_end(canvas: Sequence[tuple[int, float, int] | None], end_id: int | None) -> int | None:
    """The first position revealed as the end token. The answer is cut at its first end token, so nothing after this
    position can become part of the answer (unless the revoke sampler masks that end token again)."""
    if end_id is None:
        return None
    return next((pos for pos, cell in enumerate(canvas) if cell is not None and cell[0] == end_id), None)


def end_marker(canvas: Sequence[tuple[int, float, int] | None], end: int) -> str:
    """One quiet marker for positions end+1 .. N: how many of them were revealed (end tokens, mostly) or masked."""
    rest = canvas[end + 1:]
    revealed = sum(cell is not None for cell in rest)
    title = (f"positions {end + 2}-{len(canvas)}: after the answer's end, not part of the answer "
             f"({revealed} revealed, {len(rest) - revealed} still masked)")
    return f'<span class="end-of-answer" title="{html.escape(title, quote=True)}">{END_MARK}</span>'


def diffusion_body(view: Any, chip: Callable[..., str]) -> str:
    """The canvas of a diffusion ``render.LaneView``; ``chip(piece, state, title, style=...)`` draws a token. The
    end token is ``view.piece.end_id`` (``render.token_piece`` sets it from the tokenizer)."""
    size = view.max_new_tokens
    block = view.block_length or size
    canvas = diffusion_canvas(view.events, size)
    end = answer_end(canvas, getattr(view.piece, "end_id", None))
    steps = [e for e in view.events if isinstance(e, RefinementStep)]
    last_step = steps[-1].step if steps else None
    revoked = {p: (t, c) for p, t, c in zip(steps[-1].remasked, steps[-1].remasked_tokens,
                                             steps[-1].remask_confidences, strict=True)} if steps else {}
    joined = byte_chips.merged([view.piece(c[0]) if c else None for c in canvas], block)  # emoji: one chip
    cells, inside = [], 0
    for pos, cell in enumerate(canvas):
        if end is not None and pos == end + 1:
            cells.append(end_marker(canvas, end))
            break
        if pos % block == 0:
            if pos:
                cells.append("</div>")
            cells.append(f'<div class="block" title="block {pos // block + 1}">'
                         f'<span class="blocklabel">block {pos // block + 1}</span>')
        if cell is None and pos in revoked:
            tok, conf = revoked[pos]
            cells.append(chip(view.piece(tok), "revoked", f"position {pos + 1}: masked again at step {last_step + 1}, "
                              f"its probability fell to {conf:.2f} once its neighbours were known"))
            continue
        if cell is None:
            cells.append(f'<span class="tok mask" title="position {pos + 1}: [MASK]"></span>')
            continue
        if pos < inside:
            continue  # a byte of the character shown at the run's start
        tok, conf, step = cell
        state = "new" if step == last_step else "revealed"
        title = f"position {pos + 1} · revealed at step {step + 1} · confidence {conf:.3f}"
        piece = view.piece(tok)
        if pos in joined:
            inside, piece = joined[pos]
            group = canvas[pos:inside]
            state = "new" if any(c[2] == last_step for c in group) else "revealed"
            title = f"positions {pos + 1}-{inside}: one character over {inside - pos} byte tokens"
        cells.append(chip(piece, state, title, style=f"--conf:{max(0.0, min(1.0, conf)):.3f}"))
    if canvas:
        cells.append("</div>")
    return f'<div class="canvas">{"".join(cells)}</div>'
