"""The Engine tab's handlers against a real vLLM server: live plots while a workload runs, Stop, one clear status
line for bad input, and one request's bursts played beside the explorer's own speculative lane."""

import re
import socket
import time

import pytest
from gradio_client import Client

from explorer.app import engine_tab, ui
from explorer.measure.loadtest import start_app

PROMPTS = "def read_config(path):\nclass Stack:"


@pytest.fixture
def dead_url():
    """A loopback port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def finished(status: str) -> int:
    return int(re.match(r"Running: (\d+) / \d+ requests", status).group(1))


def test_plots_and_table_update_while_the_workload_runs(vllm_ngram):
    stamps, outs = [], []
    # 64 tokens a request: a 16-token stream came in one chunk in a clean-clone run (a loaded machine), so it had no
    # engine step to plot and the acceptance figure held 7 dots, not 8
    for out in engine_tab.run_workload(vllm_ngram, "", PROMPTS, "1,2", 2, 64, 0.0, False):
        stamps.append(time.perf_counter())
        outs.append(out)
    *running, final = outs
    live = [o for o in running if not isinstance(o[1], dict) and 0 < finished(o[0]) < 8]
    assert live, "no plot was redrawn before the workload ended"
    figure, table = live[0][1], live[0][5]
    dots = sum(len(trace.x) for trace in figure.data)
    assert dots == finished(live[0][0]) < 8  # one dot per finished request, drawn before the last one finished
    assert "running" in set(table["state"])
    # (the last yield inside the loop may come early: the poll returns as soon as the worker ends)
    gaps = [b - a for a, b in zip(stamps[:-3], stamps[1:-2], strict=True)]
    assert all(g >= engine_tab.POLL_S * 0.9 for g in gaps), f"yields faster than every {engine_tab.POLL_S} s: {gaps}"
    assert final[0].startswith("Done: 8 requests")
    acceptance, latency, itl, throughput, table = final[1:]
    assert sum(len(trace.x) for trace in acceptance.data) == 8
    assert list(table["c"]) == [1, 2] and set(table["state"]) == {"done"} and list(table["n"]) == [4, 4]
    assert all(cell.endswith("%") for cell in table["acceptance"])  # ngram: /metrics counts drafts
    assert len(latency.data) == 2 and list(latency.data[0].x) == [1, 2]  # p50 and p99 at each concurrency
    assert "ITL" in itl.layout.title.text and len(itl.data) == 2 and list(throughput.data[0].x) == [1, 2]


def test_stop_ends_the_workload_and_keeps_what_finished(vllm_ngram):
    outs = []
    # 60 requests, so that a Stop after the first finished one has work left to cut (with 12, a clean-clone CI run
    # saw all of them finish before the Stop took effect: the tiny model answers 24 tokens in tens of ms)
    for out in engine_tab.run_workload(vllm_ngram, "", PROMPTS, "1", 30, 24, 0.0, False):
        outs.append(out)
        if out[0].startswith("Running") and finished(out[0]) >= 1:
            engine_tab.stop_workload(None)
    final = outs[-1]
    n = int(re.match(r"Stopped: (\d+) of 60 requests", final[0]).group(1))
    assert 1 <= n < 60
    assert list(final[5]["n"]) == [n]
    assert engine_tab._CANCELS == {}


@pytest.mark.parametrize("url, compare, prompts, concurrency, words", [
    ("", "", PROMPTS, "1", "the engine URL is empty"),
    ("127.0.0.1:8011", "", PROMPTS, "1", "must start with http://"),
    ("DEAD", "", PROMPTS, "1", "nothing answers at"),
    ("LIVE", "DEAD", PROMPTS, "1", "nothing answers at"),
    ("LIVE", "", PROMPTS, "1,x", "comma-separated whole numbers"),
    ("LIVE", "", PROMPTS, "0", "concurrency values must be in 1..64"),
    ("LIVE", "", "  \n", "1", "the prompts box is empty"),
])
def test_bad_input_gives_one_status_line(vllm_ngram, dead_url, url, compare, prompts, concurrency, words):
    subst = {"LIVE": vllm_ngram, "DEAD": dead_url}
    outs = list(engine_tab.run_workload(subst.get(url, url), subst.get(compare, compare), prompts, concurrency, 1,
                                        8, 0.0, False))
    assert len(outs) == 1
    status, *rest = outs[0]
    assert status.startswith("⚠") and words in status, status
    assert all(isinstance(r, dict) for r in rest)  # gr.skip(): the plots keep what they showed


def test_compare_where_nothing_listens_says_so(dead_url):
    outs = list(engine_tab.compare_one(dead_url, "def f():", 16, 0.0, False, 1.0))
    assert len(outs) == 1 and f"nothing answers at {dead_url}" in outs[0][1]


def lane(frame: str, name: str) -> str:
    return re.search(rf'<section class="lane lane-{name}".*?</section>', frame, re.S).group(0)


def test_compare_plays_the_engines_bursts_beside_the_explorers_lane(vllm_ngram):
    outs = list(engine_tab.compare_one(vllm_ngram, "def read_config(path):", 24, 0.0, False, 1.0))
    frames = [f for f, _ in outs if isinstance(f, str) and 'data-lane="engine"' in f and "--lanes:2" in f]
    final, status = outs[-1]
    engine = lane(final, "engine")
    steps = int(re.search(r'data-steps="(\d+)"', engine).group(1))
    tokens = int(re.search(r'data-tokens="(\d+)"', engine).group(1))
    assert 'data-status="done"' in engine and 0 < steps <= tokens <= 24
    assert engine.count('class="step') == steps  # one box per streamed chunk
    assert engine.count('class="tok acc"') == tokens - steps  # a step of k tokens: k - 1 accepted drafts
    assert 'data-status="done"' in lane(final, "speculative")
    assert "Greedy: the engine's tokens equal the explorer's" in status  # greedy, float32, the same model
    played = [int(re.search(r'data-steps="(\d+)"', lane(f, "engine")).group(1)) for f in frames[:-1]]
    assert played == sorted(played) and played[0] < steps, "the engine's steps did not appear one by one"


@pytest.fixture(scope="module")
def app_url():
    demo, url = start_app("random-tiny")
    yield url
    demo.close()


def test_the_tab_answers_through_the_api_and_keeps_serving(app_url, vllm_ngram, dead_url):
    client = Client(app_url, verbose=False)
    status, *_ = client.predict(dead_url, "", PROMPTS, "1", 1, 8, 0.0, False, api_name="/engine_workload")
    assert "nothing answers at" in status
    status, *_, table = client.predict(vllm_ngram, "", "def f(x):", "1", 1, 8, 0.0, False,
                                            api_name="/engine_workload")
    assert status.startswith("Done: 1 request in") and table["data"][0][3] == 1


def test_no_engine_tab_on_a_space(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "user/space")
    names = {fn.api_name for fn in ui.build_demo("random-tiny").fns.values()}
    assert "run" in names and "engine_workload" not in names
