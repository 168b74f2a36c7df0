"""The app through its public API (gradio_client), and the handlers the buttons call."""

import json
import threading
import time
from pathlib import Path

import gradio as gr
import pytest
from gradio_client import Client, handle_file

import explorer
from explorer import ui
from explorer.events import Proposal
from explorer.loadtest import start_app

PROMPT = "def parse(line):"
LANES = ["autoregressive", "speculative", "diffusion"]
# prompt, preset, lanes, max_new_tokens, temperature, top_p, seed, drafter, gamma, adaptive_gamma,
# steps, block_length, remasking, threshold
RESULT = 2  # /run outputs: frame, run table, token ids per lane, model info, figures ..., replay scrubber
RUN_ARGS = (PROMPT, "random-tiny", LANES, 32, 0.0, 1.0, 0, "model", 4, False, 16, 16, "low_confidence", 0.0)


@pytest.fixture(scope="module")
def app_url():
    demo, url = start_app("random-tiny")
    yield url
    demo.close()


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def test_run_streams_frames_and_ends_with_the_decode_token_ids(client, random_models):
    job = client.submit(*RUN_ARGS, api_name="/run")
    final = job.result(timeout=120)
    frames = [out[0] for out in job.outputs() if out and isinstance(out[0], str)]
    assert len(frames) >= 4, "expected several animation frames"
    assert any('class="tok mask"' in f and 'data-status="running"' in f for f in frames[:-1])
    assert any("data-masks-left" in f for f in frames)
    result = final[RESULT]
    expected = {
        "autoregressive": explorer.decode("autoregressive", random_models, PROMPT, max_new_tokens=32, seed=0),
        "speculative": explorer.decode("speculative", random_models, PROMPT, max_new_tokens=32, seed=0, gamma=4,
                                       drafter="model"),
        "diffusion": explorer.decode("diffusion", random_models, PROMPT, max_new_tokens=32, seed=0, steps=16,
                                     block_length=16, remasking="low_confidence"),
    }
    for method, trace in expected.items():
        assert result[method]["token_ids"] == trace.token_ids, method
    # greedy, float32: speculative decoding reproduces the autoregressive output exactly, and the app says so
    assert result["speculative"]["token_ids"] == result["autoregressive"]["token_ids"]
    assert "Greedy check: speculative output equals the autoregressive output" in final[0]


def test_bad_input_gives_one_clear_message_and_the_app_keeps_serving(client):
    bad = (RUN_ARGS[0], *RUN_ARGS[1:3], 30, *RUN_ARGS[4:])  # 30 is no multiple of block length 16
    with pytest.raises(Exception, match="must be a multiple of block_length"):
        client.predict(*bad, api_name="/run")
    with pytest.raises(Exception, match="the prompt is empty"):
        client.predict("   ", *RUN_ARGS[1:], api_name="/run")
    ok = client.predict(PROMPT, "random-tiny", ["speculative"], 8, *RUN_ARGS[4:], api_name="/run")
    assert list(ok[RESULT]) == ["speculative"] and len(ok[RESULT]["speculative"]["token_ids"]) == 8


def test_measure_repeats_and_summarizes(client):
    args = (PROMPT, None, 3, "random-tiny", ["autoregressive", "speculative"], 8, *RUN_ARGS[4:])
    status, summary, *_ = client.predict(*args, api_name="/measure")
    assert "6 decodes" in status
    rows = summary["data"] if isinstance(summary, dict) else summary
    assert len(rows) == 2
    csv_path, json_path = client.predict(api_name="/export")  # this client's session history
    assert Path(csv_path).read_text().count("\n") >= 7  # header + 6 requests (+ earlier runs of this session)
    assert json.loads(Path(json_path).read_text())[-1]["events"]


def test_uploaded_workload_runs_every_prompt(client, tmp_path):
    prompts = tmp_path / "traffic.jsonl"
    prompts.write_text('{"prompt": "def a(x):"}\n{"prompt": "class B:"}\n', encoding="utf-8")
    args = ("", handle_file(str(prompts)), 2, "random-tiny", ["autoregressive"], 8, *RUN_ARGS[4:])
    status, summary, *_ = client.predict(*args, api_name="/workload")
    assert status.startswith("Done: 4 decodes")  # 2 prompts × 2 repeats × 1 lane
    with pytest.raises(Exception, match="upload a prompt file first"):
        client.predict("", None, 1, "random-tiny", ["autoregressive"], 8, *RUN_ARGS[4:], api_name="/workload")


def test_prompt_file_is_bounded_and_parsed(tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("first prompt\n\nsecond <b>prompt</b>\n", encoding="utf-8")
    assert [p.text for p in ui.read_prompt_file(str(lines))] == ["first prompt", "second <b>prompt</b>"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"prompt": "b\\nc", "temperature": 1.2}\n', encoding="utf-8")
    parsed = ui.read_prompt_file(str(jsonl))
    assert [p.text for p in parsed] == ["a", "b\nc"] and parsed[1].temperature == 1.2
    too_many = tmp_path / "many.txt"
    too_many.write_text("x\n" * (ui.MAX_PROMPTS + 1), encoding="utf-8")
    with pytest.raises(gr.Error, match="limit is 200"):
        ui.read_prompt_file(str(too_many))
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (ui.MAX_PROMPT_FILE_BYTES + 1))
    with pytest.raises(gr.Error, match="kB"):
        ui.read_prompt_file(str(big))
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(gr.Error, match="UTF-8"):
        ui.read_prompt_file(str(binary))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"}\nnot json\n', encoding="utf-8")
    with pytest.raises(gr.Error, match="line 2"):
        ui.read_prompt_file(str(broken))


def test_replay_steps_through_the_finished_traces(random_models):
    traces = {m: explorer.decode(m, random_models, PROMPT, max_new_tokens=8, steps=4, block_length=8) for m in LANES}
    current = {"traces": traces, "pieces": {m: str for m in LANES}}
    html, at = ui.replay_step(current, 0.0)
    assert at > 0 and 'data-status="running"' in html
    html, back = ui.replay_step(current, at, backwards=True)
    assert back < at
    frames = list(ui.replay_play(current, 0.0, slow_motion=1))
    assert frames[-1][0].count('data-status="done"') == 3
    files = ui.export_traces(list(traces.values()))
    assert files[0].endswith(".csv") and files[1].endswith(".json")


def test_greedy_note_points_at_the_first_difference(random_models):
    ar = explorer.decode("autoregressive", random_models, PROMPT, max_new_tokens=6)
    spec = explorer.decode("speculative", random_models, PROMPT, max_new_tokens=6)
    assert "equals" in ui.greedy_note({"autoregressive": ar, "speculative": spec})
    spec.token_ids = spec.token_ids[:3] + [spec.token_ids[3] + 1] + spec.token_ids[4:]
    assert "differ from token 4 on (float32: unexpected" in ui.greedy_note({"autoregressive": ar, "speculative": spec})


def test_a_finished_decode_plays_back_in_bounded_frames(random_models, monkeypatch):
    monkeypatch.setattr(ui, "FRAME_INTERVAL_S", 0.0)
    options = ui.Settings(max_new_tokens=64).options("speculative")
    frames = list(ui.animate_decode("speculative", random_models, PROMPT, options))
    assert len(frames) <= ui.PLAYBACK_FRAMES + 1
    assert frames[-1][2] is not None and all(trace is None for _, _, trace in frames[:-1])
    assert frames[-1][2].token_ids == explorer.decode("speculative", random_models, PROMPT, **options).token_ids
    sizes = [len(events) for events, _, _ in frames]
    assert sizes == sorted(sizes) and sizes[-1] == len(frames[-1][2].events)
    assert any(isinstance(events[-1], Proposal) for events, _, _ in frames[:-1])  # pending drafts get shown


def test_a_slow_decode_shows_live_frames_and_stops_when_closed(random_models, monkeypatch):
    monkeypatch.setattr(ui, "LIVE_AFTER_S", 0.0)
    monkeypatch.setattr(ui, "LIVE_FRAME_INTERVAL_S", 0.0)
    gen = ui.animate_decode("autoregressive", random_models, PROMPT, ui.Settings(max_new_tokens=256).options("x"))
    events, clock, trace = next(gen)
    assert trace is None  # a live frame while the decoder runs
    gen.close()  # what Stop does
    deadline = time.perf_counter() + 10
    while any(t.name == "decode-autoregressive" for t in threading.enumerate()) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "decode-autoregressive" for t in threading.enumerate())


def test_settings_map_to_decode_options():
    s = ui.Settings(max_new_tokens=32, top_p=1.0, block_length=0, threshold=0.0, steps=8)
    assert s.options("autoregressive") == {"max_new_tokens": 32, "temperature": 0.0, "top_p": None, "seed": 0}
    diffusion = s.options("diffusion", seed_offset=2)
    assert diffusion["block_length"] is None and diffusion["threshold"] is None and diffusion["seed"] == 2
    assert s.options("speculative")["drafter"] == "model"
