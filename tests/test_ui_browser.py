"""The app in real Chromium: the animation, the plots, and that model/user text stays text.

Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`); skipped without it.
Screenshots go to artifacts/screenshot.png. With EXPLORER_DOCS_SCREENSHOT=1 the run uses the app's
default preset (the embedded models when present) and also writes docs/screenshot.png for the README.
"""

import os
from pathlib import Path

import pytest

from explorer import ui
from explorer.loadtest import start_app

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
DOCS = os.environ.get("EXPLORER_DOCS_SCREENSHOT") == "1"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium)")

# Installed before Run is pressed: records what every frame showed, so intermediate frames can be checked.
RECORDER = """() => {
  window.seen = {masks: [], pending: 0, verdicts: 0};
  const lanes = document.querySelector('#lanes');
  new MutationObserver(() => {
    const d = lanes.querySelector('.lane-diffusion');
    if (d) window.seen.masks.push(Number(d.dataset.masksLeft));
    window.seen.pending += lanes.querySelectorAll('.lane-speculative .tok.pend').length;
    window.seen.verdicts += lanes.querySelectorAll('.lane-speculative .tok.acc, .lane-speculative .tok.rej').length;
  }).observe(lanes, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


@pytest.fixture(scope="module")
def app_url():
    demo, url = start_app("tiny" if DOCS else "random-tiny")
    yield url
    demo.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, app_url):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(app_url)
    page.wait_for_selector("#model-info >> text=Device", timeout=120_000)  # preset loaded and warmed up
    yield page
    page.close()


def run_and_wait(page, prompt: str | None) -> None:
    """Run ``prompt`` (None: the prompt and settings already in the page) and wait for the last lane."""
    if prompt is not None:
        page.fill("#prompt textarea", prompt)
    page.click("#run")
    page.wait_for_selector('#lanes .lane-diffusion[data-status="done"]', timeout=120_000)


def test_run_animates_every_lane_and_draws_the_plots(page):
    page.evaluate(RECORDER)
    if DOCS:  # the README shows prompt lookup on a code edit: most drafts accepted
        page.get_by_role("button", name=ui.EXAMPLE_LABELS[1]).click()
        page.wait_for_timeout(500)
    run_and_wait(page, None if DOCS else ui.EXAMPLES[0][0])
    seen = page.evaluate("window.seen")
    masks = [m for m in seen["masks"] if m == m]  # drop NaN
    assert masks[0] == 48 and masks[-1] == 0, masks
    assert len(set(masks)) >= 4, f"expected intermediate frames, saw masks-left {sorted(set(masks))}"
    assert seen["pending"] > 0 and seen["verdicts"] > 0, seen
    assert page.locator("#lanes .lane-speculative .tok.acc, #lanes .lane-speculative .tok.rej").count() > 0
    assert page.locator('#lanes .lane[data-status="done"]').count() == 3
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 7", timeout=30_000)
    page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
    (ROOT / "artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "artifacts" / "screenshot.png"), full_page=False)
    page.screenshot(path=str(ROOT / "artifacts" / "screenshot-full.png"), full_page=True)
    if DOCS:  # for the README: the lanes, with the preset line above them
        page.locator("#model-info").scroll_into_view_if_needed()
        page.evaluate("document.querySelector('#model-info').scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
        (ROOT / "docs").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "docs" / "screenshot.png"))


def test_script_in_the_prompt_renders_as_text(page):
    payload = "x = 1  # <script>alert(1)</script><img src=x onerror=alert(2)>"
    run_and_wait(page, payload)
    page.wait_for_timeout(300)
    assert page.dialogs == []
    assert page.locator("#lanes script, #lanes img").count() == 0
    assert "<script>alert(1)</script>" in page.locator("#lanes .lane-autoregressive .prompt").inner_text()


def test_race_replay_steps_back_and_plays_to_the_end(page):
    run_and_wait(page, "def f(x):")
    for _ in range(3):
        page.click("#replay-back")
        page.wait_for_timeout(300)
    page.wait_for_selector('#lanes .lane[data-status="running"]', timeout=10_000)
    assert "Race replay at t =" in page.locator("#lanes .frame-caption").inner_text()
    page.click("#replay-play")
    page.wait_for_function("document.querySelectorAll('#lanes .lane[data-status=\"done\"]').length === 3",
                           timeout=60_000)
