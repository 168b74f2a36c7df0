"""Concurrent sessions, isolation and bounded resources (short mode of `python -m explorer loadtest`)."""

import pytest

import explorer
from explorer import models as models_mod
from explorer.measure.loadtest import require_loopback, run_load


def test_concurrent_sessions_get_their_own_traces_without_errors():
    report = run_load(clients=3, runs=2, preset="random-tiny", max_new_tokens=8, soak=True, rss_every=2)
    summary = report.summary()
    assert summary["errors"] == 0, report.errors
    assert summary["crossed_sessions"] == 0
    assert summary["runs"] == 6 and len(report.rss_mb) == 3


@pytest.mark.parametrize("url", ["http://10.0.0.5:7860/", "http://example.org/", "http://192.168.1.2/"])
def test_load_test_refuses_non_loopback_targets(url):
    with pytest.raises(explorer.ExplorerError, match="loopback"):
        require_loopback(url)


def test_model_cache_is_bounded_lru(monkeypatch):
    loads = []

    def fake_load(name, device, dtype, hub_ids, **_):
        loads.append(name)
        return object()

    monkeypatch.setattr(models_mod, "_CACHE", type(models_mod._CACHE)())
    monkeypatch.setattr(models_mod, "CACHE_SIZE", 2)
    monkeypatch.setattr(models_mod, "_load_uncached", fake_load)
    for name in ["tiny", "random-tiny", "tiny", "smollm2-135m", "random-tiny"]:
        models_mod.load_models(name, device="cpu")
    assert len(models_mod._CACHE) == 2
    # tiny was used after random-tiny, so random-tiny was evicted first and had to be loaded again
    assert loads == ["tiny", "random-tiny", "smollm2-135m", "random-tiny"]


def test_app_listens_on_loopback_only(tmp_path):
    """`python app.py` binds 127.0.0.1 unless GRADIO_SERVER_NAME says otherwise."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_SERVER_NAME"}
    env.update(GRADIO_SERVER_PORT=str(port), OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        listening = []
        for _ in range(240):
            listening = [c.laddr for c in psutil.Process(proc.pid).net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN]
            if any(addr.port == port for addr in listening):
                break
            time.sleep(0.5)
        assert any(addr.port == port for addr in listening), "the app did not start listening"
        assert all(addr.ip in ("127.0.0.1", "::1") for addr in listening), listening
    finally:
        proc.terminate()
        proc.wait(timeout=30)
