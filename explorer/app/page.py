"""The page's assets: its prose (text/*.md), style sheets, the small scripts that run in the browser, and the
example prompts."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ASSETS = HERE.parent.parent / "assets"
STYLE = (ASSETS / "style.css").read_text(encoding="utf-8")
TEXT = HERE / "text"  # the prose of the page, in Markdown


def read_text(name: str) -> str:
    return (TEXT / name).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# page behaviour (JS) and page-wide style

# Run: at widths <= 1280 the sidebar closes (the lanes get the width); until the server's first frame every lane
# says why it waits (the preset may still be loading, or another run holds the decode slot)
SCROLL_JS = """() => { window.explorerStopUntil = 0; const el = document.querySelector('#lanes');
  if (window.innerWidth <= 1280) { const b = document.querySelector('.sidebar.open .toggle-button, '
    + '.sidebar.open button'); if (b) b.click(); }
  if (el) { el.querySelectorAll('.lane').forEach((lane) => {
      let note = lane.querySelector('.note');
      if (!note) { note = document.createElement('div'); note.className = 'note';
        lane.querySelector('.lane-head').after(note); }
      note.textContent = 'queued: starting (the preset may still be loading, or another run is decoding) …'; });
    // presenter mode: the prompt row (Run, Stop) stays on screen with the lanes under it
    const top = document.body.classList.contains('presenter') ? document.querySelector('#prompt-row') : el;
    (top || el).scrollIntoView({behavior: 'smooth', block: 'start'}); } }"""
# Stop / Pause: a cancelled handler sends no last frame (and a frame already on its way may still land), so
# for a moment after the click every lane still marked as moving is settled as stopped, after each update too.
SETTLE_JS = """() => {
  const lanes = document.querySelector('#lanes');
  const settle = () => lanes.querySelectorAll('.lane').forEach((lane) => {
    if (lane.dataset.status === 'running' || lane.dataset.status === 'waiting') {
      lane.dataset.status = 'stopped';
      const badge = lane.querySelector('.status'); if (badge) badge.textContent = 'stopped';
      const note = lane.querySelector('.note'); if (note) note.textContent = 'stopped by the user';
    } });
  const opts = {subtree: true, childList: true};
  window.explorerStopUntil = performance.now() + 3000;
  const watch = new MutationObserver(() => {
    watch.disconnect();
    if (performance.now() > window.explorerStopUntil) return;
    settle(); watch.observe(lanes, opts);
  });
  settle(); watch.observe(lanes, opts);
  setTimeout(() => watch.disconnect(), 3100);
}"""
PRESENTER_JS = """(on) => { document.body.classList.toggle('presenter', !!on); return on; }"""
# narrow screens start with the sidebar closed so Run is reachable; ?presenter=1 starts in presenter mode
LOAD_JS = """() => {
  const close = () => { const b = document.querySelector('.sidebar.open .toggle-button, .sidebar.open button');
    if (b) b.click(); };
  if (window.innerWidth < 900) setTimeout(close, 300);
  if (new URLSearchParams(location.search).get('presenter') === '1') {
    const box = document.querySelector('#presenter input'); if (box && !box.checked) box.click(); }
}"""
PAGE_CSS = (ASSETS / "page.css").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# examples

EXAMPLE_LABELS = ["explain (prose)", "write code", "edit code (prompt lookup wins)", "non-English (domain shift)",
                  "high temperature (speculation can lose)"]
# Chat prompts for the default preset (SmolLM2-135M-Instruct); a drafter of None keeps the preset's own.
EXAMPLES = [
    ["Explain photosynthesis in simple terms.", None, 0.0],
    ["Write a Python function that checks whether a number is prime.", None, 0.0],
    ["Rename the function `area` to `rectangle_area` and return the whole code:\n\n"
     "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError(\"negative size\")\n"
     "    return width * height\n", "prompt_lookup", 0.0],
    ["Erkläre in einfachen Worten, wie ein Regenbogen entsteht.", None, 0.0],
    ["Write a short poem about the sea.", None, 1.5],
]
