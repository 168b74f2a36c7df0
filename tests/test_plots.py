"""plots.py: every figure builds from real traces, states its setup, and degrades to a message."""

import math

import plotly.graph_objects as go
import pytest

import explorer
from explorer.app import plots
from explorer.measure.metrics import predicted_speedup


@pytest.fixture(scope="module")
def run(random_models):
    opts = {"max_new_tokens": 16, "temperature": 0.0, "seed": 0}
    return {"autoregressive": explorer.decode("autoregressive", random_models, "def f(x):", **opts),
            "speculative": explorer.decode("speculative", random_models, "def f(x):", gamma=3, **opts),
            "diffusion": explorer.decode("diffusion", random_models, "def f(x):", steps=8, block_length=8, **opts)}


def test_all_figures_build_and_state_the_setup(random_models, run):
    figures = plots.all_figures(list(run.values()), run, random_models.names)
    assert list(figures) == list(plots.FIGURE_KEYS)
    for key, fig in figures.items():
        assert isinstance(fig, go.Figure), key
        subtitle = fig.layout.title.subtitle.text
        assert "device cpu" in subtitle and "float32" in subtitle and "batch size 1" in subtitle, key
        assert "random-tiny/target" in subtitle, key
        assert fig.data, f"{key} has no data"
        fig.to_json()  # what gr.Plot sends to the browser


def test_figures_without_data_say_what_to_run(random_models, run):
    ar_only = [run["autoregressive"]]
    for fig in (plots.running_acceptance_figure(ar_only), plots.position_acceptance_figure(ar_only),
                plots.diffusion_reveals_figure(ar_only), plots.break_even_figure(None),
                plots.latency_percentiles_figure([])):
        assert fig.layout.annotations and not fig.data


def test_break_even_curve_matches_the_formula_and_marks_the_measured_point(run):
    spec = run["speculative"]
    fig = plots.break_even_figure(spec, run["autoregressive"])
    c, gamma = plots.cost_ratio(spec), spec.stats["gamma"]
    chosen = next(t for t in fig.data if t.name == f"γ = {gamma}")
    a, y = chosen.x[100], chosen.y[100]
    assert y == pytest.approx((1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1)))
    measured = next(t for t in fig.data if t.name == "measured vs AR lane")
    assert measured.y[0] == pytest.approx(plots.measured_speedup(spec, run["autoregressive"]))
    assert 0 <= plots.alpha_estimate(spec) <= 1 and c > 0
    assert predicted_speedup(0.0, gamma, c) == pytest.approx(1 / (gamma * c + 1))


def test_position_acceptance_counts_every_check(run):
    spec = run["speculative"]
    checked, accepted = plots._position_counts([spec])
    assert checked.sum() == sum(len(e.checks) for e in spec.events if hasattr(e, "checks"))
    assert accepted.sum() == spec.stats["accepted"]
    rates = spec.stats["per_position_acceptance"]
    assert [a / n for a, n in zip(accepted, checked, strict=True)] == pytest.approx(rates)


def test_latency_percentiles_per_method(run):
    fig = plots.latency_percentiles_figure(list(run.values()))
    p99 = [t for t in fig.data if t.name == "p99"]
    assert len(p99) == 3 and set(p99[0].x) == set(run)
    request = p99[2]  # third panel: request latency
    ms = dict(zip(request.x, request.y, strict=True))
    assert math.isclose(ms["speculative"], run["speculative"].stats["wall_s"] * 1e3)


def test_latency_percentiles_never_pool_different_settings(random_models):
    """Two temperatures of one method are two setups (two bars), never one pooled '2 runs'."""
    cold = explorer.decode("speculative", random_models, "def f(x):", max_new_tokens=8)
    hot = explorer.decode("speculative", random_models, "def f(x):", max_new_tokens=8, temperature=1.2, seed=1)
    fig = plots.latency_percentiles_figure([cold, hot, cold])
    labels = [t for t in fig.data if t.name == "p50"][0].x
    assert len(labels) == 2 and any("T=1.2" in x for x in labels) and any("T=0 " in x for x in labels), labels
