"""How fast the UI is: app start, click to first animated frame, frames per second, UI overhead.

    python benchmarks/ui_speed.py [--preset tiny] [--repeats 5] [--max-new 48] [--json out.json]

A measurement, not a test: numbers depend on the machine and its load. Method:
  * start: a fresh interpreter imports the app, builds and launches it, then loads and warms up
    the preset (what the first visitor waits for);
  * click -> frame and fps: real Chromium (if /usr/bin/chromium exists) clicks Run and a
    MutationObserver stamps every DOM update of the lanes, another the run table's first (the results, sent
    with the plots when the run has ended);
  * render cost: render.lanes_html on the final (largest) frame of each lane;
  * UI overhead: each lane's decoder wall time inside the running app (worker thread, frames
    rendered and streamed to a gradio_client in this process) against explorer.decode alone in a
    worker thread, alternating, median of --repeats. The decoders always yield their events (a
    list append of a small dataclass per step), so "decoding without events" does not exist; the
    overhead that can matter is the UI's, and that is what this measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
SETTLE_S = 0.3  # quiet time before each measured decode (the previous one's output is still being handled)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
PROMPT = "Write a Python function that lists the .py files under a folder."
MAX_NEW: int | None = None  # --max-new: N for every lane (default: the app's)
PLAYBACK: str | None = None  # --playback: a Playback option's label, e.g. "live" (default: the app's)

START_CHILD = """
import time, json, sys
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from explorer.app import handlers, lane_settings, ui
t_import = time.perf_counter()
demo = ui.build_demo(default_preset={preset!r})
t_build = time.perf_counter()
demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port={port}, quiet=True)
t_launch = time.perf_counter()
lane_settings.load_preset({preset!r})
t_models = time.perf_counter()
demo.close()
print(json.dumps({{"import_s": t_import - t0, "build_s": t_build - t_import, "launch_s": t_launch - t_build,
                  "serving_s": t_launch - t0, "models_ready_s": t_models - t0}}))
"""

OBSERVER = """() => {
  const lanes = document.querySelector('#lanes');
  window.frames = [];
  new MutationObserver(() => {
    const t = performance.now();
    const tokens = [...lanes.querySelectorAll('.lane')].map(l => Number(l.dataset.tokens || 0));
    const last = window.frames[window.frames.length - 1];
    const bars = [...lanes.querySelectorAll('.decoding .bar')].map(b => b.style.width).join(',');
    const key = tokens.join(',') + ':' + bars + ':' + lanes.textContent;  // progress frames count too
    if (!last || last.key !== key) window.frames.push({t, key, tokens: tokens.reduce((a, b) => a + b, 0),
      done: lanes.querySelectorAll('.lane[data-status="done"]').length});
  }).observe(lanes, {subtree: true, childList: true, characterData: true, attributes: true});
  window.resultsAt = null;  // the run table gets its lane rows (with the plots) when the run has ended
  const table = document.querySelector('#run-table');
  new MutationObserver(() => {
    if (window.resultsAt === null && table.textContent.includes('speculative')) window.resultsAt = performance.now();
  }).observe(table, {subtree: true, childList: true, characterData: true});
  window.clicked = performance.now();
  document.querySelector('#run').click();
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_start(preset: str) -> dict:
    code = START_CHILD.format(root=str(ROOT), port=free_port(), preset=preset)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_browser(preset: str, runs: int) -> dict:
    from playwright.sync_api import sync_playwright

    from explorer.app import ui

    demo = ui.build_demo(default_preset=preset)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    results = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#model-info >> text=Device", timeout=300_000)
            _fill(page)
            for _ in range(runs):
                page.evaluate(OBSERVER)
                page.wait_for_function("window.frames.length && window.frames.at(-1).done === 3 && window.resultsAt",
                                       timeout=300_000)
                page.wait_for_timeout(300)
                results.append(_frame_stats(page.evaluate("[window.clicked, window.frames, window.resultsAt]")))
                page.reload()
                page.wait_for_selector("#model-info >> text=Device", timeout=300_000)
                _fill(page)
            browser.close()
    finally:
        demo.close()
    return {key: statistics.median(r[key] for r in results) for key in results[0]} | {"runs": len(results)}


def _fill(page) -> None:
    """The prompt, and N when --max-new is given (the slider's number box, committed with Enter)."""
    page.fill("#prompt textarea", PROMPT)
    if MAX_NEW:
        box = page.locator("#max-new input[type=number]")
        box.fill(str(MAX_NEW))
        box.press("Enter")
        page.wait_for_timeout(300)
    if PLAYBACK:
        box = page.locator("#speed input")
        box.click()
        box.fill(PLAYBACK)  # the dropdown filters its options; Enter picks the first that matches
        page.wait_for_timeout(300)
        box.press("Enter")
        page.wait_for_timeout(300)


def _frame_stats(data: list) -> dict:
    clicked, frames, results_at = data
    animated = [f for f in frames if f["tokens"] > 0]
    first, last = animated[0]["t"], frames[-1]["t"]
    gaps = [b["t"] - a["t"] for a, b in zip(animated, animated[1:], strict=False)]
    playing = [g for g in gaps if g < 200]  # between lanes the next decoder runs: not animation
    return {"click_to_first_frame_ms": frames[0]["t"] - clicked, "click_to_first_token_frame_ms": first - clicked,
            "frames": len(animated), "click_to_last_frame_s": (last - clicked) / 1e3,
            "click_to_results_s": (results_at - clicked) / 1e3,  # the run table (sent with the plots)
            "longest_still_ms": max([b["t"] - a["t"] for a, b in zip(frames, frames[1:], strict=False)]
                                    + [frames[0]["t"] - clicked]),
            "fps_whole_run": (len(animated) - 1) / ((last - first) / 1e3) if last > first else float("nan"),
            "fps_during_playback": 1e3 / statistics.median(playing) if playing else float("nan")}


def measure_overhead(preset: str, repeats: int) -> dict:
    """Each lane's wall time inside the running app (streamed to a gradio_client in this process)
    against explorer.decode alone in a worker thread; plus the render cost of one frame."""
    from gradio_client import Client

    import explorer
    from explorer.app import handlers, lane_settings, render, ui

    models = lane_settings.load_preset(preset)
    settings = lane_settings.preset_settings(preset)
    if MAX_NEW:
        settings = dataclasses.replace(settings, max_new_tokens=MAX_NEW)
    demo = ui.build_demo(default_preset=preset)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    args = (PROMPT, preset, list(ui.METHODS), *settings.as_inputs(), 1.0)  # playback at real time: the shortest run
    bare: dict[str, list[float]] = {m: [] for m in ui.METHODS}
    in_app: dict[str, list[float]] = {m: [] for m in ui.METHODS}
    frames: list[int] = []
    try:
        for _ in range(repeats):  # alternate, so drift in machine load hits both alike
            for method in ui.METHODS:
                time.sleep(SETTLE_S)
                bare[method].append(_decode_in_thread(explorer, method, models, settings.options(method)))
            time.sleep(SETTLE_S)
            job = client.submit(*args, api_name="/run")
            result = job.result(timeout=600)[handlers.RUN_OUTPUTS.index("result")]
            frames.append(len(job.outputs()))
            for method in ui.METHODS:
                in_app[method].append(result[method]["stats"]["wall_s"])
    finally:
        demo.close()
    out: dict = {"frames_per_run": statistics.median(frames)}
    for method in ui.METHODS:
        b, a = statistics.median(bare[method]), statistics.median(in_app[method])
        out[f"{method}_min"] = {"bare_wall_ms": min(bare[method]) * 1e3, "in_app_wall_ms": min(in_app[method]) * 1e3,
                                "ui_overhead_pct": (min(in_app[method]) / min(bare[method]) - 1) * 100}
        trace = explorer.decode(method, models, PROMPT, **settings.options(method))
        view = render.trace_view(trace, render.token_piece(lane_settings.lane_tokenizer(models, method)))
        start = time.perf_counter()
        for _ in range(50):
            render.lanes_html([render.lane_html(view)], [method])
        out[method] = {"bare_wall_ms": b * 1e3, "in_app_wall_ms": a * 1e3, "ui_overhead_pct": (a / b - 1) * 100,
                       "events": len(trace.events), "render_final_frame_ms": (time.perf_counter() - start) / 50 * 1e3}
    return out


def _decode_in_thread(explorer, method: str, models, options: dict) -> float:
    """explorer.decode alone, in a worker thread like the UI's (torch's intra-op threading differs
    between the main thread and others, so both sides of the comparison run in a worker thread)."""
    walls: list[float] = []
    worker = threading.Thread(target=lambda: walls.append(
        explorer.decode(method, models, PROMPT, **options).stats["wall_s"]))
    worker.start()
    worker.join()
    return walls[0]


def main() -> None:
    from explorer.app.ui import DEFAULT_PRESET

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=DEFAULT_PRESET)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--browser-runs", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice); use 1 "
                        "on a CPU shared with other jobs, where 2 OpenMP threads on 1 free core stall")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-overhead", action="store_true", help="only app start and click -> frame")
    parser.add_argument("--max-new", type=int, help="N of every lane (default: the app's)")
    parser.add_argument("--playback", help="pick the Playback option whose label contains this, e.g. live")
    args = parser.parse_args()
    global MAX_NEW, PLAYBACK
    MAX_NEW = args.max_new
    PLAYBACK = args.playback
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"preset": args.preset, "torch_threads": torch.get_num_threads(), "start": measure_start(args.preset)}
    if Path(CHROMIUM).exists():
        report["browser"] = measure_browser(args.preset, args.browser_runs)
    if not args.skip_overhead:
        report["overhead"] = measure_overhead(args.preset, args.repeats)
    text = json.dumps(report, indent=2, default=float)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
