"""The README screenshot: the app on the default preset after one run, in headless Chromium.

    python benchmarks/readme_screenshot.py [--width 1500 --height 1000] [--tokens 48]
        [--prompt "..."] [--out docs/screenshot.png]

Also prints what the run cost from the click: the first animated frame and the last frame (all
lanes done), which is what a visitor waits for.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.png_palette import palette  # noqa: E402
from explorer.measure.loadtest import start_app  # noqa: E402
from explorer.models import DEFAULT_PRESET  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
STAMP = """() => {
  window.t = {frames: []};
  new MutationObserver(() => window.t.frames.push(performance.now()))
    .observe(document.querySelector('#lanes'), {subtree: true, childList: true, characterData: true});
  window.t.click = performance.now();
  document.querySelector('#run').click();
}"""
DONE = "document.querySelectorAll('#lanes .lane[data-status=\"done\"]').length === 3"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1500)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompt", default="Write a Python function that checks whether a word is a palindrome.")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    start = time.time()
    demo, url = start_app(DEFAULT_PRESET)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(url)
        page.wait_for_selector("#model-info >> text=Device", state="attached", timeout=600_000)
        print(f"app served and {DEFAULT_PRESET} warm after {time.time() - start:.0f} s")
        page.fill("#prompt textarea", args.prompt)
        page.evaluate(f"() => {{ const s = document.querySelector('#max-new input[type=number]');"
                      f" s.value = {args.tokens}; s.dispatchEvent(new Event('input', {{bubbles: true}}));"
                      f" s.dispatchEvent(new Event('change', {{bubbles: true}})); }}")
        page.wait_for_timeout(500)
        page.evaluate(STAMP)
        page.wait_for_function(DONE, timeout=600_000, polling=100)
        t = page.evaluate("() => window.t")
        first, last = t["frames"][0] - t["click"], t["frames"][-1] - t["click"]
        print(f"N = {args.tokens}: first animated frame {first:.0f} ms after Run, last frame {last / 1000:.1f} s")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(args.out))
        palette(args.out)
        print(f"wrote {args.out}")
        browser.close()
    demo.close()


if __name__ == "__main__":
    main()
