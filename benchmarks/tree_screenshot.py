"""A token-tree step in the lanes, as the app draws them, screenshot in headless Chromium.

    python benchmarks/tree_screenshot.py [--tree dynamic:16] [--preset tiny] [--width 1280 --height 720]
        [--lanes autoregressive,speculative,diffusion] [--out docs/tree-1280x720.png]

Decodes the prompt with each lane's method (speculative with ``--tree``), picks the replay time of a step whose
tree had a rejected sibling and then an accepted one, and renders that frame with the app's own functions
(``playback.frame_html``: render.py, tree_view.py, narration) and style sheet (assets/style.css).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import explorer  # noqa: E402
from benchmarks.png_palette import palette  # noqa: E402
from explorer.app import playback, render  # noqa: E402
from explorer.app.page import STYLE  # noqa: E402
from explorer.decoding.events import Proposal, Verification  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def interesting_time(trace) -> float:
    """The time of a step that shows the most: a deep tree, a sibling rejected before one accepted, a long path."""
    proposals = {e.step: e for e in trace.events if isinstance(e, Proposal)}
    best, when = -1.0, trace.events[-1].t
    for e in trace.events:
        if isinstance(e, Verification) and e.path:
            depth = proposals[e.step].gamma
            rejected_then_accepted = any(not c.accepted for c in e.checks) and e.accepted > 0
            score = depth + 2 * e.accepted + 3 * rejected_then_accepted
            if score > best:
                best, when = score, e.t
    return when - trace.t0 + 1e-9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--tree", default="dynamic:16")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--prompt", default="def parse(line):\n    ")
    ap.add_argument("--lanes", default="autoregressive,speculative,diffusion")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "tree-1280x720.png")
    args = ap.parse_args()
    models = explorer.load_models(args.preset, device="cpu")
    piece = render.token_piece(models.tokenizer)
    methods = args.lanes.split(",")
    options = {"speculative": {"tree": args.tree, "drafter": "model"}}
    traces = {m: explorer.decode(m, models, args.prompt, max_new_tokens=args.tokens, temperature=args.temperature,
                                 **options.get(m, {})) for m in methods}
    at = interesting_time(traces["speculative"])
    views = {m: render.trace_view(t, piece, at) for m, t in traces.items()}
    frame = playback.frame_html(views, f"replay at {at:.3f} s: the speculative lane drafts a token tree ({args.tree})")
    page_html = f"<!doctype html><html><head><style>{STYLE}</style></head><body>{frame}</body></html>"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.set_content(page_html)
        page.wait_for_timeout(300)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        palette(args.out)
        browser.close()
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KB); step at {at:.3f} s; "
          f"{traces['speculative'].stats['tokens_per_target_pass']:.2f} tokens per target pass")


if __name__ == "__main__":
    main()
