"""The app in real Chromium (tiny preset): lanes that move together, live plots, bounded lanes, a narrated
step, Stop, a phone and a projector.

Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`); skipped without it. One app
and one browser serve every test. Screenshots go to artifacts/; with EXPLORER_DOCS_SCREENSHOT=1 they also
go to docs/ for the README.
"""

import os
import time
from pathlib import Path

import pytest

from benchmarks.png_palette import palette
from explorer.measure.loadtest import start_app

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
DOCS = os.environ.get("EXPLORER_DOCS_SCREENSHOT") == "1"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
LANE_HEIGHT_BOUND = 700  # px: a lane never grows past this, whatever N

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium)")

# Installed before Run is pressed: stamps every change of the lanes and of the plots.
RECORDER = """() => {
  window.seen = {lanes: [], plots: []};
  const lanes = document.querySelector('#lanes');
  new MutationObserver(() => {
    const state = [...lanes.querySelectorAll('.lane')].map(l => [l.dataset.lane, l.dataset.status,
                                                                 Number(l.dataset.tokens || 0)]);
    window.seen.lanes.push({t: performance.now(), state});
    const minis = lanes.querySelector('#live-plots');
    const key = minis ? minis.innerHTML.length + ':' + minis.textContent : '';
    if (minis && key !== window.lastMinis) { window.seen.plots.push(performance.now()); window.lastMinis = key; }
  }).observe(lanes, {subtree: true, childList: true, characterData: true, attributes: true});
  window.clicked = performance.now();
  document.querySelector('#run').click();
}"""
ALL_DONE = "document.querySelectorAll('#lanes .lane[data-status=\"done\"]').length === 3"
CHIP_TEXT = """(sel) => [...document.querySelectorAll(sel)].map(el => {
  const c = el.cloneNode(true); c.querySelectorAll('.mk').forEach(m => m.remove()); return c.textContent; })"""


@pytest.fixture(scope="module")
def app_url():
    demo, url = start_app("tiny")
    yield url
    demo.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def open_page(browser, app_url, width, height, query=""):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(app_url + query)
    page.wait_for_selector("#model-info >> text=Device", state="attached", timeout=120_000)  # preset warmed up
    page.wait_for_timeout(500)
    return page


def shot(page, name):
    (ROOT / "artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "artifacts" / name))
    if DOCS:
        page.screenshot(path=str(ROOT / "docs" / name))
        palette(ROOT / "docs" / name)  # 256 colours: a third of the bytes in the tracked tree


def test_projector_lanes_move_together_plots_go_live_and_narration_names_the_step(browser, app_url):
    page = open_page(browser, app_url, 1280, 720, "?presenter=1")
    assert page.locator("#lanes .lane").first.bounding_box()["y"] < 720, "lanes below the fold at 1280x720"
    page.fill("#prompt textarea", "def parse(line):\n    ")
    page.evaluate(RECORDER)
    page.wait_for_function(ALL_DONE, timeout=180_000)
    seen = page.evaluate("[window.clicked, window.seen]")
    clicked, frames, plot_changes = seen[0], seen[1]["lanes"], seen[1]["plots"]
    done_at = next(f["t"] for f in frames if sum(s == "done" for _, s, _ in f["state"]) == 3)
    together = [f for f in frames if sum(n > 0 for _, _, n in f["state"]) >= 2
                and not any(s == "done" for _, s, _ in f["state"])]
    assert together, "no frame showed two lanes with tokens before any lane was done"
    assert any(t < done_at for t in plot_changes), "the plots did not change before the run ended"
    stamps = [clicked] + [f["t"] for f in frames if f["t"] <= done_at]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    worst = gaps.index(max(gaps))
    before = frames[worst - 1]["state"] if worst else "the click"
    plotted = [round(t - clicked) for t in plot_changes]
    assert max(gaps) < 1000, (f"{max(gaps):.0f} ms without motion, between {before} and {frames[worst]['state']} "
                              f"(ending {stamps[worst + 1] - clicked:.0f} ms after the click); plots at {plotted}")
    # step back until the speculative lane's latest step holds a rejection; the narration must name its tokens.
    # The replay steps only once the finished run is in (its scrubber moved off 0); before that a click changes nothing.
    # Every lane's frames share one clock, so the steps back to the speculative lane's last rejection depend on how
    # far the other lanes ran after it on this machine: step until one shows or the replay is back at 0.
    at = "Number(document.querySelector('#scrubber input[type=number]').value)"
    page.wait_for_function(f"{at} > 0", timeout=30_000)
    while not page.locator("#lanes .lane-speculative .step.last .rej").count() and page.evaluate(at) > 0:
        before = page.evaluate(at)
        page.click("#replay-back")
        page.wait_for_function(f"{at} < {before}", timeout=10_000)
        page.wait_for_timeout(50)  # the lanes follow the scrubber in the same update
    accepted = page.evaluate(CHIP_TEXT, "#lanes .lane-speculative .step.last .kept .acc")
    rejected = page.evaluate(CHIP_TEXT, "#lanes .lane-speculative .step.last .dropped .rej")
    assert rejected, "no step with a rejection found"
    story = page.locator("#narration .narr-speculative").inner_text()
    for token in accepted + rejected:
        assert token in story, (token, story)
    assert "rejected" in story
    assert page.locator('#lanes .lane[data-status="running"]').count() == 0  # a still frame
    page.locator("#lanes").scroll_into_view_if_needed()
    shot(page, "narrated-step.png")
    # the replay's number box: typing a time shows that time
    box = page.locator("#scrubber input[type=number]")
    box.fill("0")
    box.press("Enter")
    page.wait_for_function("document.querySelector('#lanes .frame-caption').textContent.includes('t = 0.0 ms')",
                           timeout=10_000)
    page.click("#replay-play")
    page.wait_for_function(ALL_DONE, timeout=60_000)
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "presenter-1280x720.png")
    page.close()


def test_phone_reaches_run_and_stop_leaves_no_lane_running(browser, app_url):
    page = open_page(browser, app_url, 390, 844)
    box = page.locator("#run").bounding_box()
    assert box["y"] + box["height"] <= 844 and box["x"] + box["width"] <= 390, box
    hit = page.evaluate(f"document.elementFromPoint({box['x'] + box['width'] / 2}, {box['y'] + box['height'] / 2})"
                        ".closest('#run') !== null")
    assert hit, "something covers Run on a phone"
    shot(page, "phone.png")
    payload = "x = 1  # <script>alert(1)</script><img src=x onerror=alert(2)>"
    page.fill("#prompt textarea", payload)
    n = page.locator("#max-new input[type=number]")  # long enough that Stop comes while the lanes still decode
    n.fill("256")
    n.press("Tab")
    page.wait_for_function("document.querySelector('#diffusion-plan').textContent.includes('N = 256')",
                           timeout=10_000)
    page.click("#run")
    page.wait_for_selector('#lanes .lane[data-status="running"]', timeout=60_000)
    page.wait_for_timeout(300)
    page.click("#stop")
    page.wait_for_timeout(1500)
    assert page.locator('#lanes .lane[data-status="running"]').count() == 0
    assert page.locator('#lanes .lane[data-status="stopped"]').count() >= 1
    assert page.dialogs == [] and page.locator("#lanes script, #lanes img").count() == 0
    assert "<script>alert(1)</script>" in page.locator("#lanes .lane-autoregressive .prompt").inner_text()
    page.close()


def test_the_waiting_lanes_follow_the_controls(browser, app_url):
    """Before a run, each lane's header says what Run would do now: N, the sampler, which lanes are on."""
    page = open_page(browser, app_url, 1280, 720)
    head = "document.querySelector('#lanes .lane-diffusion .lane-head')"
    assert "N = 64" in page.locator("#lanes .lane-diffusion .lane-head").inner_text()
    n = page.locator("#max-new input[type=number]")
    n.fill("16")
    n.press("Tab")
    page.wait_for_function(f"{head}.textContent.includes('N = 16')", timeout=10_000)
    page.locator("#sampler label", has_text="dilated").click()
    page.wait_for_function(f"{head}.textContent.includes('sampler dilated')", timeout=10_000)
    shot(page, "controls-follow-1280x720.png")
    page.locator("#lane-choice label", has_text="diffusion").click()
    page.wait_for_function("!document.querySelector('#lanes .lane-diffusion') && "
                           "document.querySelector('#lanes .lane-speculative')", timeout=10_000)
    page.close()


def test_the_longest_output_keeps_every_lane_bounded(browser, app_url):
    page = open_page(browser, app_url, 1500, 1000)
    n = page.locator("#max-new input[type=number]")
    n.fill("256")
    n.press("Tab")
    page.wait_for_function("document.querySelector('#diffusion-plan').textContent.includes('N = 256')",
                           timeout=10_000)
    page.fill("#prompt textarea", "import os\n\n\ndef walk(root):\n")
    started = time.perf_counter()
    page.click("#run")
    page.wait_for_function(ALL_DONE, timeout=400_000)
    assert time.perf_counter() - started < 400
    heights = page.evaluate("[...document.querySelectorAll('#lanes .lane')].map(l => "
                            "l.getBoundingClientRect().height)")
    assert len(heights) == 3 and max(heights) < LANE_HEIGHT_BOUND, heights
    assert page.locator('#lanes .lane-diffusion[data-masks-left="0"]').count() == 1
    page.wait_for_timeout(500)
    shot(page, "wide-1500x1000.png")
    page.close()
