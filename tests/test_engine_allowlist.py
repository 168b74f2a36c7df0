"""The Engine tab on a shared server fetches only the engines its operator allowed (issue 27).

Every test drives the tab's own handlers (run_workload, compare_one, engine_defaults; the last test the built
Blocks through its API) against small OpenAI-compatible servers on loopback (127.0.0.1 and 127.0.0.2) that count
the requests they get. Host names resolve through a table (getaddrinfo patched), and a tripwire fails any test
that tries to connect outside loopback. No vLLM is needed.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gradio as gr
import pytest

from explorer.app import engine_tab
from explorer.engine import allow

PROMPTS = "def read_config(path):\nclass Stack:"
EXPOSED = {"bind": {"GRADIO_SERVER_NAME": "0.0.0.0"}, "lan": {"GRADIO_SERVER_NAME": "192.168.1.20"},
           "share": {"GRADIO_SHARE": "True"}, "proxy": {"GRADIO_ROOT_PATH": "/explorer"}}
METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n"


# ---------------------------------------------------------------------------------------------
# fake engines, name table, tripwire

class FakeEngine:
    """An OpenAI-compatible server in a thread: /v1/models, /metrics, streamed /v1/completions; ``redirect`` maps
    paths to a URL it answers 307 with instead. ``hits`` lists every (method, path) it got."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, redirect: dict[str, str] | None = None) -> None:
        self.hits: list[tuple[str, str]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                engine.hits.append((self.command, path))
                if self.command == "POST":
                    self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if path in (redirect or {}):
                    return self._send(307, b"", "text/plain", {"Location": redirect[path]})
                if path == "/v1/models":
                    return self._send(200, json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode())
                if path == "/metrics":
                    return self._send(200, METRICS.encode(), "text/plain")
                if path == "/v1/completions":
                    return self._stream()
                self._send(404, b"{}")

            def _send(self, code: int, body: bytes, kind: str = "application/json", extra: dict | None = None):
                self.send_response(code)
                for name, value in {"Content-Type": kind, "Content-Length": str(len(body)), **(extra or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, text in enumerate(["def", " f", "():"]):
                    chunk = {"id": "x", "object": "text_completion", "created": 0, "model": "fake",
                             "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": i + 1, "total_tokens": i + 4}}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.host, self.port = host, self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engines():
    made: list[FakeEngine] = []

    def make(host: str = "127.0.0.1", port: int = 0, redirect: dict[str, str] | None = None) -> FakeEngine:
        made.append(FakeEngine(host, port, redirect))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


@pytest.fixture
def twins(engines):
    """A listed engine on 127.0.0.2 and an unlisted one on 127.0.0.1 at the same port: a name that reaches the
    second instead of the first is seen in its hits."""
    for _ in range(20):
        listed = engines("127.0.0.2")
        try:
            return listed, engines("127.0.0.1", listed.port)
        except OSError:  # that port is taken on 127.0.0.1: try another
            listed.close()
    pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")


def _from_the_check() -> bool:
    """Whether this lookup is the policy's check (allow.resolve) rather than a connection's own."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code is not allow.resolve.__code__:
        frame = frame.f_back
    return frame is not None


@pytest.fixture
def names(monkeypatch):
    """``names["host"] = [addresses]`` makes getaddrinfo answer that for host; ``names["host"] = (for_the_check,
    for_anyone_else)`` answers the policy's check one way and any other lookup (a connection by name) the other."""
    table: dict[str, object] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host  # anyio passes the name as bytes
        if name not in table:
            return real(host, port, *args, **kwargs)
        answer = table[name]
        addresses = (answer[0] if _from_the_check() else answer[1]) if isinstance(answer, tuple) else answer
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, int(port or 0)) if ":" not in a else (a, int(port or 0), 0, 0)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


_REAL_CONNECT, _REAL_CONNECT_EX = socket.socket.connect, socket.socket.connect_ex


def _outside_loopback(sock: socket.socket, address) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        return not ipaddress.ip_address(address[0].split("%")[0]).is_loopback
    except ValueError:
        return True  # a name: sockets connect to addresses


@pytest.fixture(autouse=True)
def tripwire(monkeypatch):
    """Every connection outside loopback is refused and recorded, and the test fails."""
    seen: list = []

    def connect(self, address):
        if _outside_loopback(self, address):
            seen.append(address)
            raise ConnectionRefusedError(errno.ECONNREFUSED, "tripwire: outside loopback")
        return _REAL_CONNECT(self, address)

    def connect_ex(self, address):
        if _outside_loopback(self, address):
            seen.append(address)
            return errno.ECONNREFUSED
        return _REAL_CONNECT_EX(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield seen
    assert not seen, f"connections attempted outside loopback: {seen}"


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path):
    """Loopback, nothing listed, no proxy variables, an empty engine home (no engine started here)."""
    for name in ("GRADIO_SERVER_NAME", "GRADIO_SHARE", "GRADIO_ROOT_PATH", allow.ENV_VAR, "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EXPLORER_ENGINE_HOME", str(tmp_path))
    return monkeypatch


def workload(url: str, compare: str = "", **kw) -> list[tuple]:
    return list(engine_tab.run_workload(url, compare, PROMPTS, "1", 1, 8, 0.0, False, **kw))


def record_engine(home, url: str, pid: int) -> None:
    """What `python -m explorer engine start` writes for an engine it launched."""
    port = int(url.rsplit(":", 1)[1])
    state = {"url": url, "port": port, "pid": pid, "preset": "tiny", "spec": "ngram", "gamma": 4, "model": "tiny",
             "log": "", "started": 0.0, "chat": False}
    (home / f"engine-{port}.json").write_text(json.dumps(state))


# ---------------------------------------------------------------------------------------------
# served beyond this machine

def test_the_tripwire_catches_a_connection_outside_loopback(tripwire):
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("192.0.2.1", 80))
    assert tripwire == [("192.0.2.1", 80)]
    tripwire.clear()


@pytest.mark.parametrize("how", list(EXPOSED))
def test_exposed_without_a_list_fetches_nothing_and_says_how_to_enable_it(environment, engines, tmp_path, how):
    for name, value in EXPOSED[how].items():
        environment.setenv(name, value)
    engine = engines()
    record_engine(tmp_path, engine.url, os.getpid())  # even an engine started here: nothing until a list is set
    url, chat, status = engine_tab.engine_defaults()
    assert url == "" and status.startswith("⚠") and allow.ENV_VAR in status and "\n" not in status
    outs = workload(engine.url)
    assert len(outs) == 1 and outs[0][0] == status
    compared = list(engine_tab.compare_one(engine.url, "def f():", 8, 0.0, False, 1.0))
    assert len(compared) == 1 and compared[0][1] == status
    assert engine.hits == []


def test_a_proxy_is_seen_in_the_visitors_request(engines):
    engine = engines()
    proxied = gr.Request(headers={"x-forwarded-for": "203.0.113.7"}, client={"host": "127.0.0.1"})
    outs = workload(engine.url, request=proxied)
    assert len(outs) == 1 and allow.ENV_VAR in outs[0][0] and "behind a proxy" in outs[0][0]
    assert engine.hits == []
    assert workload(engine.url)[-1][0].startswith("Done: 2 requests")  # the same page, not proxied


def test_a_listed_engine_works_and_the_environments_proxy_is_not_used(environment, engines):
    listed, proxy = engines("127.0.0.2"), engines()
    environment.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    environment.setenv(allow.ENV_VAR, f"http://127.0.0.9:1, {listed.url}/")
    environment.setenv("HTTP_PROXY", proxy.url)  # a proxy would fetch any URL for us: the tab's clients ignore it
    assert engine_tab.engine_defaults()[0] == "http://127.0.0.9:1"
    final = workload(listed.url)[-1]
    assert final[0].startswith("Done: 2 requests"), final[0]
    assert list(final[5]["n"]) == [2] and list(final[5]["errors"]) == [0]
    assert {("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions")} <= set(listed.hits)
    *_, (frame, status) = engine_tab.compare_one(listed.url, "def f():", 8, 0.0, False, 1.0)
    assert status == "Done." and 'data-lane="engine"' in frame
    assert proxy.hits == []


def test_an_unlisted_engine_is_refused(environment, engines, twins):
    listed, unlisted = twins
    other_port = engines("127.0.0.2")
    environment.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    environment.setenv(allow.ENV_VAR, listed.url)
    for url in (unlisted.url, other_port.url, f"http://localhost:{listed.port}"):
        outs = workload(url)
        assert len(outs) == 1 and "is not an engine this app allows" in outs[0][0], outs[0][0]
    outs = workload(listed.url, unlisted.url)  # a listed URL does not carry an unlisted compare URL
    assert len(outs) == 1 and "the compare URL" in outs[0][0] and "not an engine this app allows" in outs[0][0]
    (_, status), = engine_tab.compare_one(unlisted.url, "def f():", 8, 0.0, False, 1.0)
    assert "not an engine this app allows" in status
    assert unlisted.hits == [] and other_port.hits == [] and listed.hits == []


def test_a_host_name_is_judged_by_every_address_it_resolves_to(environment, twins, names):
    listed, unlisted = twins
    environment.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    environment.setenv(allow.ENV_VAR, listed.url)
    names["engine.lan"] = ["127.0.0.2"]
    names["evil.lan"] = ["127.0.0.1"]
    names["mixed.lan"] = ["127.0.0.1", "127.0.0.2"]  # one listed address is not enough
    for host in ("evil.lan", "mixed.lan"):
        outs = workload(f"http://{host}:{listed.port}")
        assert len(outs) == 1 and "not an engine this app allows" in outs[0][0], outs[0][0]
    assert unlisted.hits == [] and listed.hits == []
    assert workload(f"http://engine.lan:{listed.port}")[-1][0].startswith("Done: 2 requests")
    assert unlisted.hits == [] and listed.hits


def test_a_name_that_answers_the_check_and_the_connection_differently_reaches_only_the_checked_address(
        environment, twins, names):
    """DNS rebinding at its most precise: every lookup the policy makes gets the listed address, any other lookup
    the unlisted one. The clients connect to the address they checked, never to the name, so only the listed
    engine is reached."""
    listed, unlisted = twins
    environment.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    environment.setenv(allow.ENV_VAR, listed.url)
    names["rebind.lan"] = (["127.0.0.2"], ["127.0.0.1"])
    final = workload(f"http://rebind.lan:{listed.port}")[-1]
    assert final[0].startswith("Done: 2 requests"), final[0]
    *_, (frame, status) = engine_tab.compare_one(f"http://rebind.lan:{listed.port}", "def f():", 8, 0.0, False, 1.0)
    assert status == "Done."
    assert unlisted.hits == [] and ("POST", "/v1/completions") in listed.hits


def test_redirects_are_not_followed(environment, engines):
    unlisted, other = engines(), engines("127.0.0.2")
    to_unlisted = engines("127.0.0.2", redirect={"/v1/models": unlisted.url + "/v1/models"})
    to_listed = engines("127.0.0.2", redirect={p: other.url + p for p in ("/metrics", "/v1/completions")})
    environment.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    environment.setenv(allow.ENV_VAR, ",".join(e.url for e in (to_unlisted, to_listed, other)))
    outs = workload(to_unlisted.url)
    assert len(outs) == 1 and "redirect" in outs[0][0] and "not followed" in outs[0][0], outs[0][0]
    final = workload(to_listed.url)[-1]  # not even to a listed engine: /metrics gives none, requests fail
    assert "2 of them failed" in final[0], final[0]
    assert list(final[5]["acceptance"]) == ["unavailable"]
    assert unlisted.hits == [] and other.hits == []


def test_engines_started_here_count_as_listed_while_they_run(environment, engines, tmp_path):
    started, stopped = engines(), engines()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record_engine(tmp_path, started.url, os.getpid())
    record_engine(tmp_path, stopped.url, dead.pid)
    environment.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    environment.setenv(allow.ENV_VAR, "http://127.0.0.9:1")
    assert engine_tab.engine_defaults()[0] == started.url
    assert workload(started.url)[-1][0].startswith("Done: 2 requests")
    outs = workload(stopped.url)
    assert len(outs) == 1 and "not an engine this app allows" in outs[0][0]
    assert stopped.hits == []


# ---------------------------------------------------------------------------------------------
# bound to loopback: engines on this machine, as before

def test_bound_to_loopback_the_tab_fetches_loopback_engines(engines, names):
    here, also_here = engines(), engines("127.0.0.2")
    assert engine_tab.engine_defaults() == ("", False, engine_tab.NO_ENGINE)
    for url in (here.url, also_here.url, f"http://localhost:{here.port}"):
        assert workload(url)[-1][0].startswith("Done: 2 requests"), url
    names["remote.lan"] = ["10.1.2.3"]
    names["half.lan"] = ["127.0.0.1", "10.1.2.3"]
    for url in ("http://10.1.2.3:8000", f"http://remote.lan:{here.port}", f"http://half.lan:{here.port}"):
        outs = workload(url)
        assert len(outs) == 1 and "is not on this machine" in outs[0][0], outs[0][0]
    assert [hit for hit in here.hits if hit[0] == "POST"] == [("POST", "/v1/completions")] * 6  # 2 runs: warm-up + 2


# ---------------------------------------------------------------------------------------------
# the built page, through its API

@pytest.fixture(scope="module")
def app():
    from explorer.measure.loadtest import start_app

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    demo, url = start_app("random-tiny")
    yield demo, url
    demo.close()


def test_the_page_reads_how_it_was_launched_and_who_asks(app, engines, environment):
    from gradio_client import Client

    demo, url = app
    engine = engines()
    args = (engine.url, "", "def f(x):", "1", 1, 8, 0.0, False)
    status, *_ = Client(url, verbose=False).predict(*args, api_name="/engine_workload")
    assert status.startswith("Done: 1 request"), status  # bound to 127.0.0.1: as before
    hits = len(engine.hits)
    proxied = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
    status, *_ = proxied.predict(*args, api_name="/engine_workload")
    assert "behind a proxy" in status and allow.ENV_VAR in status
    environment.setattr(demo, "share", True)  # what launch(share=True) records
    frame, status = Client(url, verbose=False).predict(engine.url, "def f():", 8, 0.0, False, 1.0,
                                                       api_name="/engine_compare")
    assert "a share link" in status and allow.ENV_VAR in status
    assert len(engine.hits) == hits


def test_the_batch_column_is_the_streams_that_overlapped_with_the_engines_mean_beside_it():
    """Issue 23: the gauge polled every 0.1 s read 0.7 / 0.0 / 0.5 at concurrency 1 / 2 / 4; the column shows the
    streams that overlapped (bench.max_streaming), an integer, with the mean batch on the engine's clock beside it,
    or the gauge's mean where the server does not time its requests."""
    from explorer.app.engine_tab import workload_table

    row = {"label": "spec", "concurrency": 4, "requests": 8, "errors": 0, "throughput_tok_s": 50.0,
           "e2e_p50_ms": 100.0, "e2e_p99_ms": 200.0, "itl_p50_ms": 5.0, "itl_p99_ms": 9.0, "ttft_p99_ms": 30.0,
           "mean_running": 0.5, "max_streaming": 4, "tokens_per_chunk_inferred": 1.5, "acceptance": 0.4,
           "engine_batch": 3.26}
    assert workload_table([row])["batch"].tolist() == ["4 (mean 3.3)"]
    assert workload_table([{**row, "engine_batch": float("nan")}])["batch"].tolist() == ["4 (gauge 0.5)"]
