"""Live mini-plots under the lanes: plain SVG, redrawn with every frame (a plotly redraw per frame would
stall the page on a slow machine); the full plotly figures (plots.py) follow at the end of the run."""

from __future__ import annotations

import html
from collections.abc import Sequence

from explorer.app.render import LaneView
from explorer.decoding.events import Event, Proposal, RefinementStep, TokenStep, Verification

LANE_COLOURS = {"autoregressive": "#6b7280", "speculative": "#16a34a", "diffusion": "#0891b2"}
_W, _H, _PAD = 240, 84, 4


def _svg(title: str, body: str, note: str) -> str:
    return (f'<figure class="mini"><figcaption>{html.escape(title)}</figcaption>'
            f'<svg viewBox="0 0 {_W} {_H}" width="100%" height="{_H}" role="img" aria-label="{html.escape(title)}">'
            f'<rect x="0" y="0" width="{_W}" height="{_H}" class="mini-bg"/>{body}</svg>'
            f'<div class="mini-note">{html.escape(note)}</div></figure>')


def _xy(x: float, y: float) -> str:
    return f"{_PAD + x * (_W - 2 * _PAD):.1f},{_H - _PAD - y * (_H - 2 * _PAD):.1f}"


def _emitted(e: Event) -> int:
    if isinstance(e, TokenStep):
        return 1
    if isinstance(e, Verification):
        return len(e.emitted)
    if isinstance(e, RefinementStep):
        return len(e.positions)
    return 0


def live_plots_html(views: Sequence[LaneView], starts: dict[str, float], end_s: float) -> str:
    """Three small plots of the events shown so far: running acceptance, acceptance by draft position,
    and tokens against the shared clock per lane (its slope is the speed; the first step is TTFT)."""
    spec = next((v for v in views if v.method == "speculative"), None)
    # 1. running acceptance (accepted / proposed after each verify step)
    rates, proposed, accepted, drafted = [], 0, 0, 0
    for e in spec.events if spec else ():
        if isinstance(e, Proposal):
            drafted = len(e.tokens)
        elif isinstance(e, Verification):
            proposed, accepted = proposed + drafted, accepted + e.accepted
            rates.append(accepted / proposed if proposed else 0.0)
    if rates:
        pts = " ".join(_xy(i / max(1, len(rates) - 1), r) for i, r in enumerate(rates))
        body = f'<polyline points="{pts}" fill="none" stroke="{LANE_COLOURS["speculative"]}" stroke-width="2"/>'
        note = f"{rates[-1]:.0%} after {len(rates)} verify steps"
    else:
        body, note = "", "appears as the speculative lane verifies drafts"
    out = [_svg("Running acceptance (accepted / proposed)", body, note)]
    # 2. acceptance by draft position
    checked: dict[int, list[int]] = {}
    for e in spec.events if spec else ():
        if isinstance(e, Verification):
            for c in e.checks:
                checked.setdefault(c.position, []).append(int(c.accepted))
    bars = []
    if checked:
        n = max(checked) + 1
        width = (_W - 2 * _PAD) / n
        for pos in range(n):
            got = checked.get(pos, [])
            share = sum(got) / len(got) if got else 0.0
            h = share * (_H - 2 * _PAD)
            bars.append(f'<rect x="{_PAD + pos * width + 1:.1f}" y="{_H - _PAD - h:.1f}" width="{width - 2:.1f}" '
                        f'height="{h:.1f}" fill="{LANE_COLOURS["speculative"]}"><title>draft {pos + 1}: '
                        f'{sum(got)}/{len(got)} accepted</title></rect>')
        note = " · ".join(f"{p + 1}: {sum(v) / len(v):.0%}" for p, v in sorted(checked.items())[:6])
    else:
        note = "appears as drafts are checked"
    out.append(_svg("Acceptance by draft position", "".join(bars), note))
    # 3. tokens against the shared clock (latency)
    lines, finals = [], []
    for v in views:
        start = starts.get(v.method)
        if start is None:
            continue
        total, pts = 0, [_xy(0, 0)]
        for e in v.events:
            k = _emitted(e)
            if k:
                x = min(1.0, (e.t - start) / end_s) if end_s > 0 else 0.0
                pts.append(_xy(x, total / max(1, v.max_new_tokens)))
                total += k
                pts.append(_xy(x, total / max(1, v.max_new_tokens)))
        lines.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{LANE_COLOURS[v.method]}" '
                     f'stroke-width="2"><title>{v.method}</title></polyline>')
        finals.append(f"{v.method[:4]} {total}")
    note = " · ".join(finals) + f" tokens, clock to {end_s * 1e3:.0f} ms" if finals else "appears as lanes play"
    out.append(_svg("Tokens over the shared clock (slope = speed)", "".join(lines), note))
    return f'<div class="live-plots" id="live-plots">{"".join(out)}</div>'
