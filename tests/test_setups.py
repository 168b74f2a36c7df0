"""One description of what a decode's setup is (decoding/config.SETUP_OPTIONS, setup_label): Measure's rows, the
latency plot's series and the run history's pooled speedups all key on it, so two decodes that differ in any option
that changes the output distribution or the cost (or in precision) are never pooled. The tests iterate the options
themselves: a new DecodeConfig field is covered the moment it exists, or fails the first test until it is placed."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

import explorer
from explorer.app import plots, runs
from explorer.decoding.config import (
    METHODS,
    NOT_SETUP,
    OPTIONS,
    SETUP_OPTIONS,
    DecodeConfig,
    applies,
    setup_label,
)
from explorer.measure import metrics


def other_values(option):
    """Values of an option other than its default, read from its page control (a new option has them at once)."""
    c = OPTIONS[option].control
    if c.kind == "slider":
        values = [c.hi, c.lo, (c.lo + c.hi) / 2]
    elif c.kind == "choice":
        values = [v[1] if isinstance(v, tuple) else v for v in c.choices][::-1]
    elif c.kind == "check":
        values = [True, False]
    elif c.kind == "text":
        values = ["2,1", "3"]
    else:
        values = [7, 8]
    return [v for v in values if v not in (getattr(DecodeConfig, option), c.off, c.default)]


SETUP_PAIRS = [(m, o) for m in METHODS for o in SETUP_OPTIONS[m]]


def test_every_option_of_a_decode_is_part_of_a_setup_or_named_as_not():
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    placed = set(NOT_SETUP).union(*SETUP_OPTIONS.values())
    assert fields - placed == set(), "a DecodeConfig option no setup names: add it to SETUP_OPTIONS or NOT_SETUP"
    assert placed - fields == set()


@pytest.fixture(scope="module")
def lanes(random_models):
    return {m: explorer.decode(m, random_models, "abc", max_new_tokens=8) for m in METHODS}


def changed(trace, option):
    """The trace with another value of ``option``: one that changes what the decoder reads (K and the block length
    default to N)."""
    now = trace.config.get(option)
    now = trace.config["max_new_tokens"] if option in ("steps", "block_length") and now is None else now
    config = {**trace.config, option: next(v for v in other_values(option) if v != now)}
    return dataclasses.replace(trace, config=config)


@pytest.mark.parametrize("method,option", SETUP_PAIRS)
def test_two_decodes_differing_in_one_option_are_never_pooled(lanes, method, option):
    a = lanes[method]
    b = changed(a, option)
    assert setup_label(method, a.config, "float32") != setup_label(method, b.config, "float32")
    summary = metrics.grouped_summary(metrics.requests_frame([a, b]))
    assert len(summary) == 2, f"Measure pooled two {method} setups differing in {option}"
    assert plots.setup_of(a) != plots.setup_of(b)
    one = runs.make_run(1, "abc", "random-tiny", {"traces": {method: a}}, "live")
    two = runs.make_run(2, "abc", "random-tiny", {"traces": {method: b}}, "live")
    assert runs.setup_key(one) != runs.setup_key(two)


def test_the_same_setup_at_another_precision_is_another_row(lanes):
    a = lanes["speculative"]
    b = dataclasses.replace(a, stats={**a.stats, "precision": "int8"})
    assert len(metrics.grouped_summary(metrics.requests_frame([a, b]))) == 2


def test_the_seed_picks_a_sample_not_a_setup(lanes):
    a = lanes["speculative"]
    b = dataclasses.replace(a, config={**a.config, "seed": 7})
    summary = metrics.grouped_summary(metrics.requests_frame([a, b]))
    assert len(summary) == 1 and summary.iloc[0]["n"] == 2


def test_a_setup_label_reads_as_words():
    label = setup_label("speculative", DecodeConfig(drafter="assistant", gamma=6, draft_confidence=0.15), "int8")
    assert label == "assistant · γ=6 · cut=0.15 · T=0 · N=64 · int8"
    assert setup_label("diffusion", DecodeConfig(max_new_tokens=32, threshold=0.7), "int8") == \
        "confidence · K=32 · block=32 · threshold=0.7 · T=0 · N=32 · int8"


def page_value(option):
    """Another value of an option as its page control holds it (K and the block length as fractions of N)."""
    return other_values(option)[0]


@pytest.fixture(scope="module")
def page_labels():
    from explorer.app import ui

    return {getattr(b, "label", None) for b in ui.build_demo("random-tiny").blocks.values()}


@pytest.mark.parametrize("option", [f.name for f in dataclasses.fields(DecodeConfig)])
def test_every_decode_option_is_a_control_on_the_page_that_reaches_the_decoder(page_labels, option):
    """Each DecodeConfig field is a control of the built page (made from its Control: label, kind) and, set on the
    page, reaches explorer.decode's options in a method it is part of, where it acts: a new option is on the page
    by being a field. The CLI's flags are checked in test_api_cli, the setup key above."""
    from explorer.app import lane_settings

    assert OPTIONS[option].control.label in page_labels, f"{option} has no control on the page"
    page = next(p for p, name, _ in lane_settings.PAGE if name == option)
    bases = (lane_settings.Settings(max_new_tokens=64, sampler=s, drafter=d) for s, d in itertools.product(
        OPTIONS["sampler"].control.choices, OPTIONS["drafter"].control.choices))
    base = next(b for b in bases if any(applies(option, m, b.option_values()) for m in METHODS))  # where it acts
    moved = dataclasses.replace(base, **{page: page_value(option)})
    methods = [m for m in METHODS if applies(option, m, moved.options(m))] if OPTIONS[option].methods else METHODS
    assert methods, f"{option} acts in no method"
    for method in methods:
        before, after = base.options(method), moved.options(method)
        assert option in after and after[option] != before.get(option), f"{option} did not reach a {method} decode"
