"""A prediction whose timed forward passes spread too widely says so ("noisy: ... (machine busy?)"), never silently:
the break-even plot, the Why? panel, the batch cost sweep (engine check, decide) all read one flag."""

import dataclasses
import itertools

import pytest

import explorer
from explorer.app import plots
from explorer.app.handlers import why_text
from explorer.decoding.events import Proposal, TokenStep, Verification
from explorer.measure import costs
from explorer.measure.decide import batch_sentence
from explorer.measure.metrics import noise_flag, pass_spread

MS = 1e-3
TIGHT = [x * MS for x in (8, 9, 10, 10, 10, 10, 10, 10, 10, 11, 12)]  # p10 9, p50 10, p90 11: 20%
SPREAD = [x * MS for x in (6, 7, 10, 10, 10, 10, 10, 10, 10, 13, 20)]  # p10 7, p50 10, p90 13: 60%
STEADY = [x * MS for x in (9.7, 10, 10.3)]  # every subset within 6%
FLAG = "noisy: the timed passes spread by 60% (machine busy?)"


def test_a_tight_set_is_not_flagged_and_a_spread_set_is_with_the_exact_sentence():
    assert pass_spread(TIGHT) == pytest.approx(0.20) and pass_spread(SPREAD) == pytest.approx(0.60)
    assert noise_flag(TIGHT) == "" and noise_flag(TIGHT, TIGHT) == ""
    assert noise_flag(SPREAD) == FLAG
    assert noise_flag(TIGHT, SPREAD) == FLAG  # any input of the prediction that is noisy flags it
    assert noise_flag([0.01, 0.03]) == ""  # too few passes to tell


def with_pass_times(trace, seconds):
    """The trace with its verify and draft passes (and AR steps) timed as ``seconds`` (cycled)."""
    times = itertools.cycle(seconds)
    events = [dataclasses.replace(e, forward_s=next(times) * getattr(e, "draft_passes", 1))
              if isinstance(e, (Verification, Proposal, TokenStep)) else e for e in trace.events]
    return dataclasses.replace(trace, events=events)


@pytest.fixture(scope="module")
def lanes(random_models):
    kw = {"max_new_tokens": 48, "gamma": 3, "temperature": 0.0}
    return {m: explorer.decode(m, random_models, "def f(x):", **kw) for m in ("autoregressive", "speculative")}


def test_the_break_even_plot_and_the_why_panel_flag_noisy_passes(lanes):
    spec, ar = lanes["speculative"], lanes["autoregressive"]
    assert sum(isinstance(e, Verification) for e in spec.events) >= 4
    tight = plots.break_even_figure(with_pass_times(spec, STEADY), ar)
    assert "noisy" not in tight.layout.title.text
    assert "noisy" not in why_text({"autoregressive": with_pass_times(ar, STEADY),
                                    "speculative": with_pass_times(spec, STEADY)})
    noisy_spec = with_pass_times(spec, SPREAD)
    assert plots.cost_noise(noisy_spec).startswith("noisy: the timed passes spread by ")
    fig = plots.break_even_figure(noisy_spec, ar)
    assert plots.cost_noise(noisy_spec) in fig.layout.title.text
    assert any(t.name.startswith("predicted at α̂ (noisy: ") for t in fig.data if t.name)
    why = why_text({"autoregressive": with_pass_times(ar, SPREAD), "speculative": noisy_spec})
    assert "**noisy: the timed passes spread by " in why and "(machine busy?)**" in why


def test_the_batch_sweep_flags_a_batch_whose_passes_spread(random_models, monkeypatch):
    for seconds, flagged in ((TIGHT, ""), (SPREAD, FLAG)):
        times = itertools.cycle(seconds)
        monkeypatch.setattr(costs, "pass_seconds", lambda *a, _t=times: next(_t))
        frame = costs.batch_costs(random_models, 3, 0.5, (1,), reps=len(seconds) * 3, progress=False)
        assert frame["noisy"].iloc[0] == flagged
        row = {"batch": 1, "predicted_speedup_forward": 1.4, "noisy": frame["noisy"].iloc[0]}
        sentence = batch_sentence({"source": "predicted", "rows": [row], "crosses_1_at_batch": None})
        assert (FLAG in sentence) == bool(flagged)


def test_the_engine_report_and_check_print_the_flag_beside_the_predicted_gain(capsys):
    import pandas as pd

    from explorer.engine.commands import _print_rows
    from explorer.engine.figures import gain_figure

    summary = pd.DataFrame({"label": ["ngram"] * 2, "concurrency": [1, 2], "speedup_throughput": [1.1, 0.9]})
    predicted = pd.DataFrame({"label": ["ngram"] * 2, "concurrency": [1, 2], "alpha": [0.5] * 2,
                              "predicted_gain": [1.3, 1.0], "noisy": ["", FLAG]})
    names = [t.name for t in gain_figure(summary, predicted).data]
    assert f"ngram: predicted ({FLAG})" in names
    _print_rows([], predicted)
    assert f"c=1: 1.30x, c=2: 1.00x ({FLAG})" in capsys.readouterr().out
