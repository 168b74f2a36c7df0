"""A Run that waits for another session's decode says so: "queued: N ahead of you (waiting for another run to
finish, started X s ago)" on its lanes, never silent waiting; a Run stopped while holding or waiting gives its place
back. Two real /run handlers (random-tiny), the first paused while it holds the decoder."""

import pytest

from explorer.app import handlers, lane_settings, playback, turns
from explorer.app.turns import DECODES, Turns

LANES = ["autoregressive", "speculative", "diffusion"]
OUT = {name: i for i, name in enumerate(handlers.RUN_OUTPUTS)}


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(playback, "FRAME_INTERVAL_S", 0.0)
    monkeypatch.setattr(playback, "AUTO_PLAY_S", 0.05)
    monkeypatch.setattr(turns, "POLL_S", 0.05)


def a_run(prompt="def parse(line):"):
    settings = lane_settings.Settings(max_new_tokens=8, temperature=0.0, drafter="model")
    return handlers.run_lanes(prompt, "random-tiny", LANES, settings, 0.0, [], [])


def test_the_line_is_first_come_first_served_and_says_how_many_are_ahead():
    line = Turns()
    with line.ticket("run") as first, line.ticket("run") as second, line.ticket("run") as third:
        assert line.take(first, timeout=0) and not line.take(third, timeout=0.01)
        assert line.words(second) == "queued: 1 ahead of you (waiting for another run to finish, started 0 s ago)"
        assert line.words(third).startswith("queued: 2 ahead of you (waiting for another run to finish, started ")
        line.leave(first)
        assert not line.take(third, timeout=0.01) and line.take(second, timeout=0)


def test_a_second_run_while_the_first_decodes_shows_that_it_waits(random_models):
    first = a_run()
    next(first)  # the first run holds the decoder (its "Preparing preset" frame), paused here
    second = a_run("Erkläre den Regenbogen")
    frame = next(second)[OUT["frame"]]
    assert "queued: 1 ahead of you (waiting for another run to finish, started " in frame
    assert frame.count('data-status="waiting"') == 3 and frame.count('class="note">queued: 1 ahead of you') == 3
    assert "Queued: 1 ahead of you" in frame  # the caption
    list(first)  # the first run ends; the second then decodes
    final = list(second)[-1][OUT["frame"]]
    assert final.count('data-status="done"') == 3 and "queued" not in final


def test_a_run_stopped_while_it_holds_or_waits_gives_its_place_back(random_models):
    first, second = a_run(), a_run()
    next(first)
    next(second)  # waiting behind the first
    second.close()  # Stop while queued
    first.close()  # Stop while decoding
    third = a_run()
    frame = next(third)[OUT["frame"]]
    assert "queued" not in frame and "Preparing preset" in frame
    third.close()
    assert DECODES._holder is None and not DECODES._line
