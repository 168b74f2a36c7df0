"""The app through its public API (gradio_client), and the handlers the buttons call."""

import dataclasses
import json
import re
import threading
import time
from pathlib import Path

import gradio as gr
import pytest
from gradio_client import Client, handle_file

import explorer
from explorer.app import handlers, lane_settings, measure_tab, page, playback
from explorer.decoding.api import make_config
from explorer.measure.loadtest import start_app

PROMPT = "def parse(line):"
LANES = ["autoregressive", "speculative", "diffusion"]
RESULT = handlers.RUN_OUTPUTS.index("result")  # /run outputs: frame, run table, token ids per lane, model info, ...
# The /run inputs: prompt, preset, lanes, then lane_settings.Settings in field order, then the playback speed
# (1 = real time).
BASE = lane_settings.Settings(max_new_tokens=32, temperature=0.0, top_p=1.0, seed=0, drafter="model", gamma=4,
                   adaptive_gamma=False, tokens_per_step=2, blocks=2, remasking="low_confidence", threshold=0.0,
                   cache=lane_settings.Settings.cache)
SETTINGS = tuple(BASE.as_inputs())
SHORT = tuple(dataclasses.replace(BASE, max_new_tokens=8).as_inputs())  # the same with N = 8
RUN_ARGS = (PROMPT, "random-tiny", LANES, *SETTINGS, 1.0)


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
                                     block_length=16, remasking="low_confidence"),  # N/2 steps, blocks of N/2
    }
    for method, trace in expected.items():
        assert result[method]["token_ids"] == trace.token_ids, method
    # greedy, float32: speculative decoding reproduces the autoregressive output exactly, and the app says so
    assert result["speculative"]["token_ids"] == result["autoregressive"]["token_ids"]
    assert "Greedy check: speculative output equals the autoregressive output" in final[0]


def test_live_playback_decodes_every_lane_at_once_and_shows_tokens_as_they_come(client, random_models, monkeypatch):
    """Playback 'live': all lanes run at the same time (frames where two or more are running with tokens shown),
    and the lanes' final tokens are exactly the decodes'."""
    monkeypatch.setattr(playback, "LIVE_INTERVAL_S", 0.005)  # the miniature decodes in well under a frame
    job = client.submit(PROMPT, "random-tiny", LANES, *SETTINGS, playback.LIVE, api_name="/run")
    final = job.result(timeout=120)
    frames = [out[0] for out in job.outputs() if out and isinstance(out[0], str)]
    together = [f for f in frames[:-1] if f.count('data-status="running"') >= 2 and 'class="tok' in f]
    assert together, "no frame showed two lanes decoding at once with their tokens"
    assert not any("waits its turn" in f for f in frames)
    assert "decoded at once" in final[0]
    ar = explorer.decode("autoregressive", random_models, PROMPT, max_new_tokens=32, seed=0)
    assert final[RESULT]["autoregressive"]["token_ids"] == ar.token_ids
    assert final[RESULT]["speculative"]["token_ids"] == ar.token_ids


def test_bad_input_gives_one_clear_message_and_the_app_keeps_serving(client):
    with pytest.raises(Exception, match="control character"):
        client.predict("def f():\x07", *RUN_ARGS[1:], api_name="/run")
    with pytest.raises(Exception, match="the prompt is empty"):
        client.predict("   ", *RUN_ARGS[1:], api_name="/run")
    ok = client.predict(PROMPT, "random-tiny", ["speculative"], *SHORT, 1.0, api_name="/run")
    assert list(ok[RESULT]) == ["speculative"] and len(ok[RESULT]["speculative"]["token_ids"]) == 8


def test_measure_repeats_and_summarizes(client):
    args = (PROMPT, None, 3, "random-tiny", ["autoregressive", "speculative"], *SHORT)
    status, summary, per_prompt, *_ = client.predict(*args, api_name="/measure")
    assert "6 decodes" in status
    rows = summary["data"] if isinstance(summary, dict) else summary
    assert len(rows) == 2
    csv_path, json_path = client.predict(api_name="/export")  # this client's session history
    assert Path(csv_path).read_text().count("\n") >= 7  # header + 6 requests (+ earlier runs of this session)
    assert json.loads(Path(json_path).read_text())[-1]["events"]


def test_uploaded_workload_runs_every_prompt(client, tmp_path):
    prompts = tmp_path / "traffic.jsonl"
    prompts.write_text('{"prompt": "def a(x):"}\n{"prompt": "class B:"}\n', encoding="utf-8")
    args = ("", handle_file(str(prompts)), 2, "random-tiny", ["autoregressive"], *SHORT)
    status, summary, *_ = client.predict(*args, api_name="/workload")
    assert status.startswith("Done: 4 decodes")  # 2 prompts × 2 repeats × 1 lane
    with pytest.raises(Exception, match="upload a prompt file first"):
        client.predict("", None, 1, "random-tiny", ["autoregressive"], *SHORT, api_name="/workload")


def test_prompt_file_is_bounded_and_parsed(tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("first prompt\n\nsecond <b>prompt</b>\n", encoding="utf-8")
    assert [p.text for p in measure_tab.read_uploaded_prompts(str(lines))] == ["first prompt", "second <b>prompt</b>"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"prompt": "b\\nc", "temperature": 1.2}\n', encoding="utf-8")
    parsed = measure_tab.read_uploaded_prompts(str(jsonl))
    assert [p.text for p in parsed] == ["a", "b\nc"] and parsed[1].temperature == 1.2
    too_many = tmp_path / "many.txt"
    too_many.write_text("x\n" * (measure_tab.MAX_PROMPTS + 1), encoding="utf-8")
    with pytest.raises(gr.Error, match="limit is 200"):
        measure_tab.read_uploaded_prompts(str(too_many))
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (measure_tab.MAX_PROMPT_FILE_BYTES + 1))
    with pytest.raises(gr.Error, match="kB"):
        measure_tab.read_uploaded_prompts(str(big))
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(gr.Error, match="UTF-8"):
        measure_tab.read_uploaded_prompts(str(binary))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"}\nnot json\n', encoding="utf-8")
    with pytest.raises(gr.Error, match="line 2"):
        measure_tab.read_uploaded_prompts(str(broken))


def test_replay_steps_through_the_finished_traces(random_models):
    traces = {m: explorer.decode(m, random_models, PROMPT, max_new_tokens=8, steps=4, block_length=8) for m in LANES}
    current = {"traces": traces, "pieces": {m: str for m in LANES}}
    html, at = playback.replay_step(current, 0.0)
    assert at > 0 and 'data-status="stopped"' in html  # a still frame: nothing runs, nothing says "running"
    assert 'data-status="running"' not in html
    typed = playback.replay_at(current, 1e9)  # a time typed into the scrubber's box, beyond the end: clamped
    assert typed.count('data-status="done"') == 3
    html, back = playback.replay_step(current, at, backwards=True)
    assert back < at
    # Step pressed before a live run's last frame is in (no finished run yet): the lanes and scrubber stay as they are
    assert all(out == gr.skip() for out in playback.replay_step(None, 2500.0, backwards=True))
    assert playback.replay_at(None, 2500.0) == gr.skip()
    frames = list(playback.replay_play(current, 0.0, speed=1))
    assert frames[-1][0].count('data-status="done"') == 3
    files = measure_tab.export_traces(list(traces.values()))
    assert files[0].endswith(".csv") and files[1].endswith(".json")


def test_greedy_note_points_at_the_first_difference(random_models):
    ar = explorer.decode("autoregressive", random_models, PROMPT, max_new_tokens=6)
    spec = explorer.decode("speculative", random_models, PROMPT, max_new_tokens=6)
    assert "equals" in handlers.greedy_note({"autoregressive": ar, "speculative": spec})
    spec.token_ids = spec.token_ids[:3] + [spec.token_ids[3] + 1] + spec.token_ids[4:]
    note = handlers.greedy_note({"autoregressive": ar, "speculative": spec})
    assert "differ from token 4 on (float32: unexpected" in note


def test_decode_alone_reports_progress_then_the_trace_and_stops_when_closed(random_models, monkeypatch):
    monkeypatch.setattr(playback, "PROGRESS_INTERVAL_S", 0.0)
    options = lane_settings.Settings(max_new_tokens=16).options("speculative")
    items = list(playback.decode_alone("speculative", random_models, PROMPT, options))
    assert items[-1][2] is not None and all(trace is None for _, _, trace in items[:-1])
    assert items[-1][2].token_ids == explorer.decode("speculative", random_models, PROMPT, **options).token_ids
    options = lane_settings.Settings(max_new_tokens=256).options("autoregressive")
    gen = playback.decode_alone("autoregressive", random_models, PROMPT, options)
    events, clock, trace = next(gen)
    assert trace is None  # a progress item while the decoder runs
    gen.close()  # what Stop does
    deadline = time.perf_counter() + 10
    while any(t.name == "decode-autoregressive" for t in threading.enumerate()) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "decode-autoregressive" for t in threading.enumerate())


def test_run_plays_every_lane_together_with_live_plots(random_models, monkeypatch):
    """Phase 1 shows only progress; in phase 2 the lanes move on one clock and the live plots with them."""
    monkeypatch.setattr(playback, "FRAME_INTERVAL_S", 0.0)
    monkeypatch.setattr(playback, "AUTO_PLAY_S", 3.0)
    settings = lane_settings.Settings(max_new_tokens=16)
    outs = list(handlers.run_lanes(PROMPT, "random-tiny", LANES, settings, 0.0, []))
    frame_i = handlers.RUN_OUTPUTS.index("frame")
    frames = [o[frame_i] for o in outs]
    phase1 = [f for f in frames if 'class="decoding"' in f]
    assert phase1 and all(set(re.findall(r'data-tokens="(\d+)"', f)) == {"0"} for f in phase1)  # progress only
    together = [f for f in frames if 'data-status="done"' not in f
                and sum(int(n) > 0 for n in re.findall(r'data-tokens="(\d+)"', f)) >= 2]
    assert together, "no frame showed two lanes with tokens before any lane was done"
    minis = [f.split('id="live-plots"')[1] for f in together if 'id="live-plots"' in f]
    assert len(set(minis)) >= 2, "the live plots under the lanes should change while the lanes play"
    assert frames[-1].count('data-status="done"') == 3


def test_every_max_new_tokens_value_is_valid_with_the_defaults():
    """K and the block length follow N: every slider position (8..256 step 8) validates for every lane."""
    models = lane_settings.load_preset("tiny")
    for n in range(8, 257, 8):
        settings = lane_settings.Settings(max_new_tokens=n)
        assert lane_settings.check_inputs(models, page.EXAMPLES[0][0], list(LANES), settings) == list(LANES)
        for per_step in lane_settings.TOKENS_PER_STEP:
            for blocks in lane_settings.BLOCKS:
                cfg = make_config("diffusion", models, lane_settings.Settings(n, tokens_per_step=per_step,
                                                                     blocks=blocks).options("diffusion"))
                assert cfg.diffusion_steps <= n


def test_settings_map_to_decode_options():
    s = lane_settings.Settings(max_new_tokens=32, top_p=1.0, threshold=0.0, tokens_per_step=4, blocks=2)
    assert s.options("autoregressive") == {"max_new_tokens": 32, "temperature": 0.0, "top_p": None, "top_k": None,
                                           "seed": 0}
    diffusion = s.options("diffusion", seed_offset=2)
    assert (diffusion["steps"], diffusion["block_length"]) == (8, 16)
    assert diffusion["threshold"] is None and diffusion["seed"] == 2
    assert s.options("speculative")["drafter"] == "model"
    assert lane_settings.Settings.from_values([getattr(s, n) for n in lane_settings.SETTING_NAMES]) == s


def test_stop_and_errors_leave_every_lane_in_a_final_state(random_models, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(playback, "AUTO_PLAY_S", 0.1)
    monkeypatch.setattr(explorer, "stream", lambda method, *a, **k: broken() if method == "diffusion"
                        else _real_stream(method, *a, **k))
    outs = []
    with pytest.raises(gr.Error, match="boom"):
        for out in handlers.run_lanes(PROMPT, "random-tiny", LANES, lane_settings.Settings(max_new_tokens=8), 0.0, []):
            outs.append(out)
    last = outs[-1][0]
    assert 'data-lane="diffusion"' in last and 'data-status="error"' in last.split('data-lane="diffusion"')[1][:80]
    assert 'data-status="running"' not in last and 'data-status="waiting"' not in last


_real_stream = explorer.stream


def test_audit_tab_gives_the_same_report_as_the_api_and_cli(client, random_models, monkeypatch):
    from explorer.app import audit_tab
    from explorer.measure.audit import report_lines, run_audit

    monkeypatch.setattr(audit_tab, "AUDIT_MAX_SAMPLES", 300)  # the same report at a sixth of the app's cap (time)
    text = client.predict("abc", "random-tiny", 1.0, 2, 3, api_name="/audit")
    direct = run_audit(random_models, "abc", temperature=1.0, top_k=2, gamma=3, max_samples=300)
    assert "capped at 300" in text
    assert text.startswith(f"### {direct.status}") and "\n".join(report_lines(direct)) in text
    with pytest.raises(Exception, match="the prompt is empty"):
        client.predict("   ", "random-tiny", 1.0, 2, 3, api_name="/audit")


def test_the_drafter_gamma_and_diffusion_controls_follow_the_preset():
    """The controls start at the default preset's own values and change with the preset: its drafters (the
    ones it can run, its own selected), its γ and where its draft stops, and the diffusion steps and blocks it was
    measured with."""
    start = lane_settings.preset_settings("smollm2-135m")
    smollm2 = explorer.models.PRESETS["smollm2-135m"]
    assert (start.drafter, start.gamma, start.tokens_per_step, start.blocks, start.threshold) == (
        "assistant", smollm2.gamma, 1, 8, smollm2.diffusion_threshold)
    assert start.draft_confidence == smollm2.draft_confidence > 0
    info, *updates = lane_settings.describe_preset("random-tiny", progress=None)
    got = dict(zip(lane_settings.PRESET_CONTROLS, updates, strict=True))
    preset = explorer.load_models("random-tiny", device="cpu").preset
    assert "random-tiny" in info and "assistant" in got["drafter"]["choices"] and got["drafter"]["value"] == \
        preset.drafter
    assert (got["gamma"]["value"], got["tokens_per_step"]["value"], got["blocks"]["value"]) == (
        preset.gamma, preset.diffusion_tokens_per_step, preset.diffusion_blocks)
    assert got["threshold"]["value"] == (preset.diffusion_threshold or 0.0)  # the slider's "off"
    assert got["draft_confidence"]["value"] == (preset.draft_confidence or 0.0)
    assert got["sampler"]["value"] == preset.diffusion_sampler
    assert got["no_adjacent_repeat"]["value"] is preset.diffusion_no_adjacent_repeat is False
    assert start.no_adjacent_repeat is smollm2.diffusion_no_adjacent_repeat is True
    assert got["no_repeat_ngram"]["value"] == preset.diffusion_no_repeat_ngram == 0
    assert start.no_repeat_ngram == smollm2.diffusion_no_repeat_ngram == 4
    assert got["cache"]["value"] == "dual" and preset.diffusion_cache is None  # the option's default
    assert start.cache == smollm2.diffusion_cache == "delayed"
    info, drafter, *_ = lane_settings.describe_preset("tiny", progress=None)
    assert "assistant" not in drafter["choices"]


def test_the_draft_confidence_control_cuts_the_speculative_lanes_drafts(client, random_models):
    """The sidebar's draft-confidence slider reaches the decoder: the lane's tokens are the decode's with that cut
    (its drafts shorter than γ), and 0 means a full chain even where the preset has a cut of its own."""
    cut = tuple(dataclasses.replace(BASE, max_new_tokens=16, draft_confidence=0.3).as_inputs())
    final = client.predict(PROMPT, "random-tiny", ["speculative"], *cut, 1.0, api_name="/run")
    expected, full = (explorer.decode("speculative", random_models, PROMPT, max_new_tokens=16, seed=0, gamma=4,
                                      drafter="model", draft_confidence=c) for c in (0.3, None))
    assert expected.stats["proposed"] < full.stats["proposed"], "the cut must shorten some drafts"
    lane = final[RESULT]["speculative"]
    assert lane["token_ids"] == expected.token_ids and lane["stats"]["proposed"] == expected.stats["proposed"]
    assert lane_settings.Settings(max_new_tokens=8).options("speculative")["draft_confidence"] is None


def test_the_tree_control_runs_a_token_tree_in_the_speculative_lane(client, random_models):
    """The sidebar's token-tree box reaches the decoder: the lane draws the tree and its tokens are the tree
    decode's (greedy: also the autoregressive lane's)."""
    tree = tuple(dataclasses.replace(BASE, max_new_tokens=8, tree="2,2").as_inputs())
    job = client.submit(PROMPT, "random-tiny", ["autoregressive", "speculative"], *tree, 1.0, api_name="/run")
    final = job.result(timeout=120)
    frames = [out[0] for out in job.outputs() if out and isinstance(out[0], str)]
    assert any('class="tree"' in f for f in frames)
    expected = explorer.decode("speculative", random_models, PROMPT, max_new_tokens=8, seed=0, gamma=4,
                               drafter="model", tree="2,2")
    assert final[RESULT]["speculative"]["token_ids"] == expected.token_ids == \
        final[RESULT]["autoregressive"]["token_ids"]


def test_a_long_prompt_is_timed_before_the_run_said_while_read_and_refused_past_what_fits(random_models,
                                                                                          monkeypatch):
    """The prefill's cost comes from a pass measured here: each lane says it while it reads the prompt (a line
    that changes as the seconds pass), and a prompt this machine cannot read within the limit is refused in one
    line that says what fits."""
    from explorer.app import prefill

    monkeypatch.setattr(handlers, "LONG_PROMPT_TOKENS", 8)
    long_prompt = "def parse(line):\n" + "    x = 1\n" * 25  # under random-tiny's 512-token context
    tokens = len(random_models.tokenizer(long_prompt).input_ids)
    options = {m: lane_settings.Settings(max_new_tokens=16, blocks=4).options(m) for m in LANES}
    est = prefill.estimate(random_models, tokens, options)
    per = prefill.seconds_per_token(random_models)
    assert per > 0 and est["autoregressive"] == pytest.approx(per * tokens)
    assert est["diffusion"] == pytest.approx(4 * est["autoregressive"])  # a full pass at each of 4 blocks
    slow = {"reading": 0}
    real_receive = playback._receive

    def slow_receive(inbox, received, deadline):  # the first events arrive late: the lanes are still reading
        slow["reading"] += 1
        if slow["reading"] < 6:
            time.sleep(0.2)
            return None
        return real_receive(inbox, received, deadline)

    monkeypatch.setattr(playback, "_receive", slow_receive)
    monkeypatch.setattr(playback, "LIVE_INTERVAL_S", 0.05)
    outs = list(handlers.run_lanes(long_prompt, "random-tiny", LANES, lane_settings.Settings(max_new_tokens=8),
                                   -1.0, []))
    frames = [o[handlers.RUN_OUTPUTS.index("frame")] for o in outs]
    notes = [f for f in frames if "reading the prompt" in f]
    assert notes and f"{tokens:,} tokens" in notes[0] and "measured" in notes[0]
    monkeypatch.setattr(prefill, "PREFILL_LIMIT_S", per * tokens / 2)  # this machine "reads" half of it in time
    with pytest.raises(gr.Error, match=r"tokens fit here") as info:
        list(handlers.run_lanes(long_prompt, "random-tiny", LANES, lane_settings.Settings(max_new_tokens=8), -1.0,
                                []))
    assert f"{tokens:,} tokens" in str(info.value) and "\n" not in str(info.value)
