"""What a visitor meets while waiting, in real Chromium (tiny preset): the checklist's progress line and its tables
for people, a long prompt said while it is read, and one refused past what this machine reads in time, the page
serving on. Skipped without Debian's chromium, like test_ui_browser.py."""

import re

import pytest
from test_ui_browser import ARGS, CHROMIUM, shot
from test_ui_browser_history import open_page, run, set_number, table

from explorer.app import handlers, playback, prefill
from explorer.measure.loadtest import start_app

pytestmark = pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium)")
# stamps every text the page shows in a progress line, a lane's note or a toast, until the page is closed
WATCH = """() => {
  window.said = new Set();
  new MutationObserver(() => {
    document.querySelectorAll('.progress-level, .progress-text, #lanes .note, .toast-body')
      .forEach(e => window.said.add(e.innerText.trim()));
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
LONG_PROMPT = "def parse(line):\n" + "    x = 1\n" * 25


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


def said(page) -> list[str]:
    return page.evaluate("[...window.said]")


def open_tab(page, name):
    """A tab by its label, from the overflow menu where the row is too narrow for it (1280 px)."""
    tab = page.locator(f"button[role=tab]:has-text('{name}')")
    if not tab.count() or not tab.first.is_visible():
        page.click(".overflow-menu button, button.overflow-menu, [class*=overflow] button")
        page.wait_for_timeout(300)
    page.locator(f"button:has-text('{name}')").last.click()
    page.wait_for_timeout(300)


def test_the_checklist_says_how_far_it_is_and_answers_in_tables_for_people(browser, app_url):
    page = open_page(browser, app_url)
    open_tab(page, "Deployment checklist")
    page.evaluate(WATCH)
    page.click("#decide-run")
    page.wait_for_function("/enable|no clear gain|error/.test(document.querySelector('#decide-verdicts').innerText)"
                           " && !document.querySelector('.progress-level')", timeout=600_000)
    verdicts = page.locator("#decide-verdicts").inner_text()
    assert re.search(r"(enable|no clear gain) for code at T = 0: [\d.]+x", verdicts), verdicts
    lines = [s for s in said(page) if re.search(r"request \d+ of \d+, the (autoregressive|speculative) lane", s)]
    assert len(lines) >= 3 and any(re.search(r"about \d+ s left", s) for s in lines), said(page)
    headers = page.evaluate("[...document.querySelectorAll('table thead th')].map(th => th.innerText.trim())")
    assert "Speedup vs autoregressive" in headers and "Drafter KV cache" in headers, headers
    assert not [h for h in headers if "_" in h], headers  # no raw column names
    cells = [c for t in ("groups", "tail", "memory", "diff") for row in table(page, f"#decide-{t}") for c in row]
    for cell in cells:
        for number in re.findall(r"\d[\d,.]*", cell):
            assert len(re.sub(r"\D", "", number).lstrip("0")) <= 4, cell  # no raw bytes, no long fractions
    assert any(c.endswith("MiB") for c in cells) and any(re.fullmatch(r"[\d.]+x \[[\d.]+–[\d.]+\]", c)
                                                         for c in cells), cells
    shot(page, "checklist-1280x720.png")
    page.close()


def test_a_long_prompt_is_said_while_read_and_one_past_what_fits_is_refused_in_one_line(browser, app_url,
                                                                                        monkeypatch):
    monkeypatch.setattr(handlers, "LONG_PROMPT_TOKENS", 8)
    real_receive = playback._receive
    calls = {"n": 0}

    def slow_receive(inbox, received, deadline):  # the first events arrive late: the lanes are still reading
        calls["n"] += 1
        if calls["n"] < 12:
            __import__("time").sleep(0.25)
            return None
        return real_receive(inbox, received, deadline)

    monkeypatch.setattr(playback, "_receive", slow_receive)
    page = open_page(browser, app_url)
    set_number(page, "max-new", 8)
    page.evaluate(WATCH)
    run(page, LONG_PROMPT)
    texts = said(page)
    assert any(re.search(r"A long prompt: [\d,]+ tokens\. Every lane reads all of it", t) for t in texts), texts
    reading = [t for t in texts if re.search(r"reading the prompt: [\d,]+ tokens, about \d+ s alone on this "
                                             r"machine \(measured\); \d+ s so far", t)]
    assert reading, texts

    monkeypatch.setattr(playback, "_receive", real_receive)
    per = prefill._PER_TOKEN[max(prefill._PER_TOKEN, key=lambda k: prefill._PER_TOKEN[k])]
    monkeypatch.setattr(prefill, "PREFILL_LIMIT_S", per * 20)  # this machine "reads" 20 tokens in time
    page.evaluate(WATCH)
    page.click("#run")
    page.wait_for_function("[...window.said].some(t => /tokens fit here/.test(t))", timeout=60_000)
    refusal = [t for t in said(page) if "tokens fit here" in t]
    assert re.search(r"This prompt is [\d,]+ tokens: reading it once \(the prefill\) takes about", refusal[0])
    shot(page, "long-prompt-refused-1280x720.png")

    orders, _ = run(page, "def parse(line):\n")  # the page serves on
    assert orders
    page.close()
