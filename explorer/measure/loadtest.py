"""Load and soak test of the running app, through its public API, on the loopback address only.

    python -m explorer loadtest --clients 8 --runs 3            # concurrent sessions
    python -m explorer loadtest --clients 1 --runs 200 --soak   # resident memory over many runs

Starts the app in this process on 127.0.0.1 (or drives ``--url``, which must be a loopback
address), runs ``clients`` gradio_client sessions at once, each ``runs`` times, and reports
request latency p50/p99 under load, errors, and whether any session received a trace that
was not its own (each session has its own prompt and seed, and checks the returned token ids
against ``explorer.decode`` on its own inputs). With ``--soak`` it samples the process's
resident memory every few runs and reports the growth after the warm-up.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import psutil
from gradio_client import Client

import explorer
from explorer.app import ui
from explorer.app.handlers import RUN_OUTPUTS
from explorer.app.lane_settings import Settings
from explorer.decoding.config import METHODS
from explorer.errors import ExplorerError
from explorer.measure.metrics import percentile

LANES = list(METHODS)


@dataclass
class LoadReport:
    clients: int
    runs_per_client: int
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    crossed: int = 0  # results that matched another session's inputs instead of this session's
    rss_mb: list[tuple[int, float]] = field(default_factory=list)  # (runs done, resident MB)
    wall_s: float = 0.0

    def summary(self) -> dict:
        growth = None
        if len(self.rss_mb) >= 2:
            growth = self.rss_mb[-1][1] - self.rss_mb[0][1]
        return {"clients": self.clients, "runs": len(self.latencies_s) + len(self.errors),
                "errors": len(self.errors), "crossed_sessions": self.crossed,
                "latency_p50_s": percentile(self.latencies_s, 50), "latency_p99_s": percentile(self.latencies_s, 99),
                "wall_s": self.wall_s, "rss_first_mb": self.rss_mb[0][1] if self.rss_mb else None,
                "rss_last_mb": self.rss_mb[-1][1] if self.rss_mb else None, "rss_growth_mb": growth,
                "rss_series_mb": [(n, round(mb, 1)) for n, mb in self.rss_mb]}


def require_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ExplorerError(f"the load test only targets loopback addresses (127.0.0.0/8, ::1), not {host!r}")


def start_app(preset: str) -> tuple[object, str]:
    """Build the app on ``preset`` and serve it on a free loopback port; returns (demo, url)."""
    demo = ui.build_demo(default_preset=preset)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    return demo, f"http://127.0.0.1:{port}/"


def session_inputs(index: int, preset: str, max_new_tokens: int) -> tuple:
    """Each session: its own prompt and seed, sampled at temperature 0.8 so outputs differ by session.
    The /run inputs: prompt, preset, lanes, then explorer.app.ui.Settings in field order, then the playback speed
    (real time here: the load test measures serving, not the animation)."""
    prompt = f"def handler_{index}(request):\n"
    settings = Settings(max_new_tokens=max_new_tokens, temperature=0.8, top_p=1.0, seed=1000 + index, drafter="model",
                        gamma=4, adaptive_gamma=False, tokens_per_step=2, blocks=1, remasking="low_confidence",
                        threshold=0.0)
    return (prompt, preset, LANES, *settings.as_inputs(), 1.0)


def expected_ids(models, inputs: tuple) -> dict[str, list[int]]:
    prompt, _, lanes, *values, _speed = inputs
    settings = Settings.from_values(values)
    return {m: explorer.decode(m, models, prompt, **settings.options(m)).token_ids for m in LANES}


def run_load(clients: int = 8, runs: int = 3, preset: str = "tiny", url: str | None = None,
             max_new_tokens: int = 16, soak: bool = False, rss_every: int = 10) -> LoadReport:
    demo = None
    if url is None:
        demo, url = start_app(preset)
    require_loopback(url)
    models = explorer.load_models(preset)
    inputs = [session_inputs(i, preset, max_new_tokens) for i in range(clients)]
    expected = [expected_ids(models, x) for x in inputs]
    report, lock, done = LoadReport(clients, runs), threading.Lock(), [0]
    process = psutil.Process()

    def sample_rss() -> None:
        report.rss_mb.append((done[0], process.memory_info().rss / 2**20))

    def session(i: int) -> None:
        client = Client(url, verbose=False)
        for _ in range(runs):
            start = time.perf_counter()
            try:
                result = client.predict(*inputs[i], api_name="/run")[RUN_OUTPUTS.index("result")]
                got = {m: result[m]["token_ids"] for m in LANES}
            except Exception as exc:  # noqa: BLE001 (every failure is counted and reported)
                with lock:
                    report.errors.append(f"session {i}: {type(exc).__name__}: {exc}"[:300])
                continue
            with lock:
                report.latencies_s.append(time.perf_counter() - start)
                report.crossed += got != expected[i]
                done[0] += 1
                if soak and done[0] % rss_every == 0:
                    sample_rss()

    start = time.perf_counter()
    threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.wall_s = time.perf_counter() - start
    if demo is not None:
        demo.close()
    return report
