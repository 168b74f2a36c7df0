"""Issue 23 in real Chromium (tiny preset): lanes keep their order whichever finishes first, the run history
tells runs apart, the Measure tab keeps two setups, the audit at T = 0 is not PASS, and at 1280x720 every lane
is at least 300 px wide after Run. Skipped without Debian's chromium, like test_ui_browser.py."""

import contextlib
import re

import pytest
from test_ui_browser import ARGS, CHROMIUM, shot

from explorer.measure.loadtest import start_app

pytestmark = pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium)")
ORDER = ["autoregressive", "speculative", "diffusion"]
ALL_DONE = "document.querySelectorAll('#lanes .lane[data-status=\"done\"]').length === 3"
# stamps the lanes' order and any lane that waits without a note, at every change of the lanes
RECORDER = """() => {
  window.orders = []; window.silent = []; window.left = false;
  const lanes = document.querySelector('#lanes');
  new MutationObserver(() => {
    const all = [...lanes.querySelectorAll('.lane')];
    window.orders.push(all.map(l => l.dataset.lane).join(','));
    if (all.some(l => l.dataset.status !== 'done')) window.left = true;  // this run has begun
    all.filter(l => l.dataset.status === 'waiting' && !(l.querySelector('.note') || {}).textContent)
       .forEach(l => window.silent.push(l.dataset.lane));
  }).observe(lanes, {subtree: true, childList: true, characterData: true, attributes: true});
  document.querySelector('#run').click();
}"""
TABLE = """(sel) => [...document.querySelectorAll(sel + ' [role=row]')].map(
  tr => [...tr.querySelectorAll('[role=gridcell]')].map(td => td.innerText.trim())).filter(r => r.length)"""


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


def open_page(browser, app_url, width=1280, height=720):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(app_url)
    page.wait_for_selector("#model-info >> text=Device", state="attached", timeout=120_000)
    page.wait_for_timeout(500)
    return page


def set_number(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Tab")
    page.wait_for_timeout(150)


def pick_playback(page, label):
    box = page.locator("#speed input")
    box.click()
    box.fill(label)  # the dropdown filters its options; Enter picks the first that matches
    page.wait_for_timeout(300)
    box.press("Enter")
    page.wait_for_timeout(300)


def table(page, selector):
    """A Dataframe's rows (it renders only the rows in view: scroll to it first)."""
    page.locator(selector).scroll_into_view_if_needed()
    page.wait_for_timeout(400)
    return page.evaluate(TABLE, selector)


def run(page, prompt):
    page.fill("#prompt textarea", prompt)
    page.evaluate(RECORDER)
    for _ in range(6):  # a click that lands while the previous run is still closing is dropped (Run triggers once,
        try:            # so a click during a run that is merely slow to start is dropped too): click again
            page.wait_for_function("window.left", timeout=5_000)
            break
        except Exception:
            page.click("#run")
    page.wait_for_function(f"window.left && {ALL_DONE}", timeout=240_000)
    page.locator("#run-table").scroll_into_view_if_needed()
    page.wait_for_function(f"({TABLE})('#run-table').length === 3", timeout=60_000)
    return page.evaluate("[window.orders, window.silent]")


def test_lane_order_is_fixed_across_runs_with_different_winners(browser, app_url):
    page = open_page(browser, app_url, 1500, 1000)
    winners = []
    # diffusion fast (2 passes for 16 tokens, live), then slow: one pass a token for 48 (the preset's confidence
    # threshold off, else a pass reveals all above it), each lane timed alone (live, three lanes share two cores and
    # whichever gets a core to itself can win: diffusion won both runs in 2 of 3 tries on one machine; alone, AR
    # takes 0.8 s and diffusion 1.3 s there)
    for per_pass, threshold, gamma, tokens, playback in (("N/8", None, 1, 16, None),
                                                         ("N (one token a pass)", 0, 8, 48, "timed: each")):
        set_number(page, "max-new", tokens)
        page.click(f"#tokens-per-step label:has-text('{per_pass}')")
        if threshold is not None:
            set_number(page, "threshold", threshold)
        set_number(page, "gamma", gamma)
        if playback:
            pick_playback(page, playback)
        orders, silent = run(page, "def parse(line):\n    ")
        page.wait_for_function(f"document.querySelector('#run-table').textContent.includes('N = {tokens}, K')",
                               timeout=240_000)  # a timed run's table comes after its replay
        assert set(orders) == {",".join(ORDER)}, f"the lanes changed order during a run: {set(orders)}"
        assert not silent, f"lanes waited with no reason on screen: {sorted(set(silent))}"
        rows = table(page, "#run-table")
        assert [r[0] for r in rows] == ORDER, rows  # the run table's rows too
        latency = {r[0]: float(r[8]) for r in rows}
        winners.append(min(latency, key=latency.get))
        story = page.evaluate("[...document.querySelectorAll('#narration .narr')].map(p => p.dataset.lane)")
        assert story == ORDER
    assert winners[0] != winners[1], f"both runs were won by {winners[0]}: the test did not change the winner"
    page.close()


def test_history_keeps_three_runs_and_the_legend_tells_them_apart(browser, app_url):
    page = open_page(browser, app_url)
    set_number(page, "max-new", 16)
    for prompt, temperature in (("def parse(line):\n", 0), ("import os\n", 0), ("def parse(line):\n", 1.2)):
        set_number(page, "temperature", temperature)
        run(page, prompt)
    page.locator("#run-history").scroll_into_view_if_needed()
    with contextlib.suppress(Exception):  # drawn after the lanes are done: time on a busy machine; the assertion
        page.wait_for_function(f"({TABLE})('#run-history').length >= 3", timeout=30_000)  # says what it shows
    rows = table(page, "#run-history")
    assert [r[0] for r in rows[:3]] == ["3", "2", "1"], rows
    assert [r[5] for r in rows[:3]] == ["1.2", "0", "0"], rows  # T, told apart
    legend = page.evaluate("[...document.querySelectorAll('#plot-running_acceptance .legendtext')]"
                           ".map(e => e.textContent)")
    assert len(legend) == 3 and len(set(legend)) == 3, legend
    assert "import os" in legend[1] and "T=1.2" in legend[2], legend
    # one click re-shows run 1's lanes
    page.locator("#show-run input").click()
    page.locator("li.item", has_text="run 1:").first.click()
    page.wait_for_function("document.querySelector('#lanes .frame-caption').textContent.includes('run 1:')",
                           timeout=20_000)
    assert page.locator("#lanes .lane[data-status=done]").count() == 3
    page.locator("#history-panel").scroll_into_view_if_needed()
    page.wait_for_timeout(400)
    shot(page, "history-1280x720.png")
    page.close()


def test_measure_keeps_two_setups(browser, app_url):
    page = open_page(browser, app_url)
    set_number(page, "max-new", 8)
    page.click("button[role=tab]:has-text('Measure')")
    set_number(page, "measure-repeats", 1)
    for gamma in (2, 4):
        set_number(page, "gamma", gamma)
        page.click("#measure-prompt")
        page.wait_for_function(f"document.querySelector('#measure-status').textContent.includes('{gamma // 2} "
                               "batch(es)')", timeout=240_000)
    setups = [r[0] for r in table(page, "#summary")]
    assert any("γ=2 " in s for s in setups) and any("γ=4 " in s for s in setups), setups
    assert "reused" in page.locator("#measure-status").inner_text()  # the AR baseline ran once
    page.close()


def test_the_audit_at_temperature_zero_is_not_pass(browser, app_url):
    page = open_page(browser, app_url)
    page.click("button[role=tab]:has-text('Audit')")
    set_number(page, "audit-temperature", 0)
    page.click("#audit-run")
    page.wait_for_function("/PASS|FAIL|INCONCLUSIVE/.test(document.querySelector('#audit-out').textContent)",
                           timeout=240_000)
    verdict = page.locator("#audit-out h3").inner_text()
    assert not verdict.startswith("PASS"), verdict
    assert re.search(r"vacuous at these settings \(greedy: no known bug changes the output; try T > 0\)", verdict)
    page.close()


def test_at_1280x720_every_lane_is_at_least_300px_wide_after_run(browser, app_url):
    page = open_page(browser, app_url)  # the sidebar starts open
    set_number(page, "max-new", 16)
    run(page, "def parse(line):\n")
    widths = page.evaluate("[...document.querySelectorAll('#lanes .lane')].map(l => l.getBoundingClientRect().width)")
    assert len(widths) == 3 and min(widths) >= 300, widths
    box = page.locator("#run").bounding_box()
    assert box["height"] > 0
    page.close()
