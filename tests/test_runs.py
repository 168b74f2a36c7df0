"""Run history (runs.py and the Run handler): every run of the page kept with its settings, told apart in the
table and the legends, re-shown without a model, compared; speedups that say where they come from."""

import dataclasses

import pytest

import explorer
from explorer.app import handlers, lane_settings, playback, plots, runs

LANES = ["autoregressive", "speculative", "diffusion"]
OUT = {name: i for i, name in enumerate(handlers.RUN_OUTPUTS)}


def run_once(prompt, past, temperature=0.0, speed=0.0):
    settings = lane_settings.Settings(max_new_tokens=8, temperature=temperature, drafter="model")
    outs = list(handlers.run_lanes(prompt, "random-tiny", LANES, settings, speed, [], past))
    return outs[-1]


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(playback, "FRAME_INTERVAL_S", 0.0)
    monkeypatch.setattr(playback, "AUTO_PLAY_S", 0.05)


def test_history_keeps_every_run_and_the_legend_tells_them_apart(random_models):
    past = []
    for prompt, temperature in (("def parse(line):", 0.0), ("Erkläre den Regenbogen", 0.0),
                                ("def parse(line):", 1.2)):
        final = run_once(prompt, past, temperature, playback.LIVE if temperature else 0.0)
        past = final[OUT["runs"]]
    assert [r["number"] for r in past] == [1, 2, 3]
    table = final[OUT["runs_table"]]
    assert list(table["run"]) == [3, 2, 1] and list(table["T"]) == ["1.2", "0", "0"]
    assert list(table["playback"]) == ["live", "timed", "timed"] and set(table["γ"]) == {"4"}
    legend = [t.name for t in final[OUT["running_acceptance"]].data]
    assert len(legend) == 3 and len(set(legend)) == 3, legend
    assert "Erkläre" in legend[1] and "T=1.2" in legend[2] and "live" in legend[2]
    points = [t.name for t in final[OUT["break_even"]].data if t.name and t.name.startswith("run ")]
    assert points == [runs.run_label(r) for r in past[:2]]  # the break-even plot keeps the earlier runs' points
    choices = [c[0] if isinstance(c, tuple) else c for c in final[OUT["show_run"]].choices]
    assert choices == [runs.run_label(r) for r in reversed(past)]
    # one click re-shows the first run's lanes, its run table and its replay state; no model runs
    frame, current, table, _ = handlers.show_run(past, runs.run_label(past[0]))
    assert current is past[0]["current"] and "Run history: run 1" in frame
    assert frame.count('data-status="done"') == 3 and table is past[0]["table"]
    compare = runs.compare_figure(past, [runs.run_label(r) for r in past[:2]])
    assert [t.name for t in compare.data if t.type == "bar"] == [runs.run_label(r) for r in past[:2]]


def test_history_is_bounded():
    run = {"number": 0}
    past = []
    for i in range(runs.RUNS_LIMIT + 5):
        past = runs.add_run(past, {**run, "number": i + 1})
    assert len(past) == runs.RUNS_LIMIT and past[0]["number"] == 6


def test_lanes_keep_the_checkbox_order_whichever_finished_first(random_models):
    traces = {m: explorer.decode(m, random_models, "def f(x):", max_new_tokens=8, steps=4, block_length=8)
              for m in reversed(LANES)}  # diffusion finished first, autoregressive last
    current = {"traces": traces, "pieces": {m: str for m in LANES}, "errors": {}}
    frame = playback.replay_frame(current, 1e9)
    order = [frame.index(f'class="lane lane-{m}"') for m in LANES]
    assert order == sorted(order), "lanes follow the finishing order"
    narrated = [frame.index(f'class="narr narr-{m}"') for m in LANES]
    assert narrated == sorted(narrated)


def speculative_and_ar(random_models, dtype=None):
    ar = explorer.decode("autoregressive", random_models, "def f(x):", max_new_tokens=8)
    spec = explorer.decode("speculative", random_models, "def f(x):", max_new_tokens=8)
    if dtype:
        spec = dataclasses.replace(spec, stats={**spec.stats, "dtype": dtype, "precision": dtype})
    return {"autoregressive": ar, "speculative": spec}


def test_a_speedup_says_its_playback_and_precision_and_spreads_over_runs(random_models):
    first = runs.make_run(1, "p", "random-tiny", {"traces": speculative_and_ar(random_models)}, "live")
    cell = runs.speedup_cell(first, [first])
    assert cell.endswith("× (1 run, live, float32)"), cell
    second = runs.make_run(2, "p", "random-tiny", {"traces": speculative_and_ar(random_models)}, "live")
    timed = runs.make_run(3, "p", "random-tiny", {"traces": speculative_and_ar(random_models)}, "timed")
    cell = runs.speedup_cell(second, [first, second, timed])
    assert "(median of 2 runs, live, float32: " in cell, cell  # the timed run is another setup
    assert runs.speedup_cell(timed, [first, second, timed]).endswith("(1 run, timed, float32)")
    bf16 = runs.make_run(4, "p", "random-tiny", {"traces": speculative_and_ar(random_models, "bfloat16")}, "live")
    assert runs.speedup_cell(bf16, [bf16]) == "not comparable (bfloat16 vs float32)"
    assert runs.history_table([first])["γ"].tolist() == ["4"]
    # a lane on int8 kernels keeps float32 tensors: the run table reads its precision, not its dtype
    int8 = {m: dataclasses.replace(t, stats={**t.stats, "precision": "int8"})
            for m, t in speculative_and_ar(random_models).items()}
    assert runs.precision(int8) == "int8"
    int8_run = runs.make_run(5, "p", "random-tiny", {"traces": int8}, "live")
    assert runs.speedup_cell(int8_run, [int8_run]).endswith("× (1 run, live, int8)")
    mixed = runs.make_run(6, "p", "random-tiny", {"traces": {**int8, "speculative": first["current"]["traces"][
        "speculative"]}}, "live")
    assert runs.speedup_cell(mixed, [mixed]) == "not comparable (float32 vs int8)"


def test_running_acceptance_labels_name_the_prompt_and_temperature(random_models):
    a = explorer.decode("speculative", random_models, "first prompt", max_new_tokens=8)
    b = explorer.decode("speculative", random_models, "second prompt", max_new_tokens=8, temperature=1.0)
    names = [t.name for t in plots.running_acceptance_figure([a, b]).data]
    assert len(set(names)) == 2 and "“first prompt”" in names[0] and "T=1" in names[1]
