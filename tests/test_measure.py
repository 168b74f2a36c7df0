"""The measure tab's numbers: grouped by setup (never pooled), a spread beside each, every trace exported."""

import csv

import numpy as np
import pandas as pd
import pytest

import explorer
from explorer.app import measure_tab
from explorer.measure import metrics

PROMPTS = ["def parse(line):", "class Stack:"]


@pytest.fixture(scope="module")
def traces(random_models):
    out = []
    for prompt in PROMPTS:
        for seed in range(2):
            out.append(explorer.decode("autoregressive", random_models, prompt, max_new_tokens=8, seed=seed))
            for gamma in (2, 4):
                out.append(explorer.decode("speculative", random_models, prompt, max_new_tokens=8, seed=seed,
                                           gamma=gamma, temperature=0.0))
            out.append(explorer.decode("diffusion", random_models, prompt, max_new_tokens=8, seed=seed, steps=4))
    return out


def test_groups_are_never_pooled_across_setups(traces):
    summary = metrics.grouped_summary(metrics.requests_frame(traces))
    spec = summary[summary["method"] == "speculative"]
    assert sorted(spec["gamma"]) == [2, 4]  # one row per γ, not one pooled speculative row
    assert list(summary["n"]) == [4, 4, 4, 4]  # 2 prompts × 2 seeds each
    assert (summary["warning"] != "").all()  # n = 4 < 5: every row says its spread is unreliable
    per_prompt = metrics.grouped_summary(metrics.requests_frame(traces), by_prompt=True)
    assert len(per_prompt) == 8 and set(per_prompt["prompt"]) == set(PROMPTS)
    assert per_prompt["n"].eq(2).all()


def test_speedup_compares_with_the_matching_reference_and_skips_other_families(traces):
    frame = metrics.requests_frame(traces)
    summary = metrics.grouped_summary(frame, other_family=["random-tiny"])
    row = summary[(summary["method"] == "speculative") & (summary["gamma"] == 4)].iloc[0]
    spt = frame["latency_s"] / frame["new_tokens"]
    ar = spt[frame["method"] == "autoregressive"].mean()
    spec = spt[(frame["method"] == "speculative") & (frame["gamma"] == 4)].mean()
    assert row["speedup"] == pytest.approx(ar / spec)
    assert row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]
    diffusion = summary[summary["method"] == "diffusion"].iloc[0]
    assert np.isnan(diffusion["speedup"]) and "another family" in diffusion["speedup_note"]
    table = measure_tab.summary_table(summary)
    assert "another family" in table[table["setup"].str.startswith("diffusion")]["speedup vs AR"].iloc[0]


def test_spread_is_a_bootstrap_interval_around_the_estimate():
    rng = np.random.default_rng(1)
    values = rng.normal(100, 10, size=200)
    p50, lo, hi = metrics.percentile_ci(values, 50)
    assert lo < p50 < hi and hi - lo < 6  # ~1.25 σ/√n · 2 · 1.96 ≈ 3.5
    wide = metrics.percentile_ci(values[:10], 50)
    assert wide[2] - wide[1] > hi - lo  # fewer samples, wider interval
    assert metrics.bootstrap_ci([]) != metrics.bootstrap_ci([])  # NaN for no data (NaN != NaN)
    assert metrics.bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)
    ratio, rlo, rhi = metrics.ratio_ci([2.0, 2.2, 1.8], [1.0, 1.1, 0.9])
    assert ratio == pytest.approx(2.0) and rlo <= 2.0 <= rhi


def test_export_writes_every_trace_with_prompt_and_settings(traces):
    many = traces * 4  # 64 requests: more than any old cap of 50
    csv_path, json_path = measure_tab.export_traces(many)
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(many)
    assert {r["prompt"] for r in rows} == set(PROMPTS)
    for column in ("method", "preset", "drafter", "gamma", "temperature", "seed", "max_new_tokens", "steps",
                   "block_length", "remasking", "top_p"):
        assert column in rows[0], column
    assert len(pd.read_json(json_path)) == len(many)


def test_setups_accumulate_across_batches_and_the_baseline_is_reused(monkeypatch):
    """A γ 2 batch then a γ 4 batch: the per-setup table keeps both until Clear, and the autoregressive baseline
    (same prompt and settings) is decoded once, not once per batch."""
    from explorer.app.lane_settings import Settings, load_preset

    load_preset("random-tiny")  # its warm-up decodes are not the batch's
    decoded = []
    real = explorer.decode
    monkeypatch.setattr(explorer, "decode", lambda method, *a, **k: decoded.append(method) or real(method, *a, **k))
    measured, history = [], []
    for gamma in (2, 4):
        settings = Settings(max_new_tokens=8, temperature=0.0, drafter="model", gamma=gamma)
        *_, last = measure_tab.measure("prompt", "def parse(line):", None, 2, "random-tiny",
                                       ["autoregressive", "speculative"], settings, history, measured)
        status, summary, per_prompt, *_, history, _, _, measured = last
    assert decoded == ["autoregressive", "speculative"] * 2 + ["speculative"] * 2
    assert "Done: 2 decodes (2 autoregressive decodes reused" in status
    assert list(summary["setup"].str.extract(r"(γ=\d+|autoregressive)")[0]) == ["autoregressive", "γ=2", "γ=4"]
    assert list(summary.columns[:4]) == ["setup", "n", "speedup vs AR", "acceptance"]  # the decision first
    status, summary, _, measured = measure_tab.clear_measured()
    assert summary.empty and measured == []


def test_integers_stay_integers_in_the_csv(traces, tmp_path):
    frame = metrics.requests_frame(traces)
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    rows = list(csv.DictReader(path.open()))
    assert {r["gamma"] for r in rows} == {"", "2", "4"} and all(r["text"] is not None for r in rows)
    table = measure_tab.summary_table(metrics.grouped_summary(frame))
    assert table["setup"].str.contains("γ=2 ").any() and not table["setup"].str.contains(r"\.0\b").any()
