"""In real Chromium (tiny preset): a Run pressed in a second tab while the first tab's run decodes says it is queued
("queued: 1 ahead of you (waiting for another run to finish, started X s ago)") and then runs; and at 1280x720 the
break-even plot sits right under the run table. Skipped without Debian's chromium, like test_ui_browser.py."""

import pytest
from test_ui_browser import CHROMIUM
from test_ui_browser_history import ALL_DONE, app_url, browser, open_page, set_number  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium)")
QUEUED = "queued: 1 ahead of you (waiting for another run to finish, started "


def test_a_second_tab_shows_its_place_in_the_queue_then_runs(browser, app_url):  # noqa: F811
    first, second = open_page(browser, app_url), open_page(browser, app_url)
    set_number(first, "max-new", 256)  # long enough to still decode when the second tab asks
    first.click("#run")
    first.wait_for_function("document.querySelectorAll('#lanes .lane[data-status=\"running\"]').length > 0",
                            timeout=60_000)
    second.click("#run")
    second.wait_for_function(f"(notes => notes.length === 3 && notes.every(n => n.textContent.startsWith({QUEUED!r})))"
                             "([...document.querySelectorAll('#lanes .lane .note')])", timeout=30_000)
    assert "Queued: 1 ahead of you" in second.locator("#lanes .frame-caption").inner_text()
    first.wait_for_function(ALL_DONE, timeout=240_000)
    second.wait_for_function(ALL_DONE, timeout=240_000)
    assert QUEUED not in second.locator("#lanes").inner_text()
    first.close()
    second.close()


def test_at_1280x720_the_break_even_plot_sits_under_the_run_table(browser, app_url):  # noqa: F811
    page = open_page(browser, app_url)
    set_number(page, "max-new", 16)
    page.click("#run")
    page.wait_for_function(ALL_DONE, timeout=240_000)
    page.evaluate("() => document.querySelector('#run-table').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(600)
    table, plot = (page.locator(s).bounding_box() for s in ("#run-table", "#plot-break_even"))
    assert 0 <= plot["y"] - (table["y"] + table["height"]) < 40, (table, plot)  # straight under it
    assert plot["y"] < 720 and plot["width"] >= 600  # in view with the table, wide enough to read
    page.close()
