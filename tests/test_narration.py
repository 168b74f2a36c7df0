"""narration.py: the exact sentence for each case a browser review found wrong (issue 23)."""

import re

from explorer.app import narration, playback, render
from explorer.decoding.events import DraftCheck, Proposal, RefinementStep, Verification

PIECES = {1: "a", 2: " b", 7: "z", 9: ","}
B = '<code><span class="ws">·</span>b</code>'


def piece(token_id: int) -> str:
    return PIECES[token_id]


def said(views, method="speculative") -> str:
    """The narration of one lane, without its title."""
    html = narration.narration_html(views)
    return re.search(rf'data-lane="{method}"><b>[^<]*</b> (.*?)</p>', html).group(1)


def verification(step, checks, accepted, emitted, resampled=None, bonus=None):
    return Verification(1.0 + step, step, tuple(checks), accepted, resampled, bonus, tuple(emitted), 0.01, 10, 10, 2)


def test_the_last_step_without_drafts_does_not_re_narrate_the_step_before():
    """With one token left the last step drafts nothing; its narration must not repeat the previous drafts."""
    first = Proposal(1.0, 0, "model", 2, (1, 2), (0.6, 0.5), 0.01, 2)
    full = verification(0, [DraftCheck(0, 1, 0.7, 0.6, 1.0, True), DraftCheck(1, 2, 0.6, 0.5, 1.0, True)], 2,
                        (1, 2, 7), bonus=7)
    last = verification(1, [], 0, (1,), bonus=1)
    view = render.LaneView("speculative", [first, full, last], "p", piece, 4, status="done", total_steps=2)
    assert said([view]) == ("Step 2 of 2: nothing was drafted: the target made <code>a</code> alone. "
                            "1 token(s) added for one target pass.")


def test_a_rejection_with_p_zero_draws_no_coin():
    """At T = 0 a draft the target does not pick has p = 0: min(1, p/q) = 0 rejects it without a coin."""
    proposal = Proposal(1.0, 0, "model", 2, (1, 2), (1.0, 1.0), 0.01, 2)
    ver = verification(0, [DraftCheck(0, 1, 1.0, 1.0, 1.0, True), DraftCheck(1, 2, 0.0, 1.0, 0.0, False)], 1,
                       (1, 7), resampled=7)
    view = render.LaneView("speculative", [proposal, ver], "p", piece, 8)
    assert said([view]) == (f"Step 1: the drafter proposed <code>a</code> {B}; the target checked them in one pass; "
                            f"<code>a</code> kept because p ≥ q; {B} <b>rejected</b> without a coin: p = 0 (the "
                            "target never picks it); a new token <code>z</code> drawn from max(0, p − q). "
                            "2 token(s) added for one target pass.")
    coin = verification(0, [DraftCheck(0, 1, 0.1, 0.5, 0.2, False)], 0, (7,), resampled=7)
    view = render.LaneView("speculative", [proposal, coin], "p", piece, 8)
    assert "<code>a</code> <b>rejected</b>: p/q = 0.20 and the coin said no" in said([view])


def test_the_drafter_is_named_as_the_lane_header_names_it():
    """The assistant drafter's class calls itself "eagle"; the options and the header say "assistant", so must the
    narration (it reads the options, never the header's words)."""
    options = {"drafter": "assistant", "gamma": 2}
    detail = render.lane_detail("speculative", options)
    proposal = Proposal(1.0, 0, "eagle", 2, (1, 2), (0.6, 0.5), 0.01, 2)
    view = render.LaneView("speculative", [proposal], "p", piece, 8, detail=detail, options=options)
    assert detail.startswith("assistant")
    assert said([view]) == f"Step 1: the assistant drafter proposed <code>a</code> {B}; the target will check all 2 " \
                           "in <b>one</b> pass."


def test_before_any_run_no_lane_claims_to_be_decoding():
    """The page opens on live playback: before Run no lane is "decoding alone, timed"."""
    frame = playback.initial_frame()
    assert "Decoding alone" not in frame
    for method in ("autoregressive", "speculative", "diffusion"):
        assert said_in(frame, method) == "Waiting: press Run to start this lane."
    waiting = render.LaneView("diffusion", [], "p", piece, 8, status="waiting",
                              note="waits its turn: each lane is timed alone")
    assert said([waiting], "diffusion") == "Waits its turn: each lane is timed alone."
    decoding = render.LaneView("diffusion", [], "p", piece, 8, status="running", progress=0.5)
    assert said([decoding], "diffusion") == ("Decoding alone, timed; it plays on the shared clock once every lane is "
                                             "decoded.")


def said_in(frame: str, method: str) -> str:
    return re.search(rf'data-lane="{method}"><b>[^<]*</b> (.*?)</p>', frame).group(1)


def test_a_draft_cut_by_confidence_says_why_it_is_shorter_than_gamma():
    """A lane that cuts drafts by the drafter's confidence says so where a draft stops short of γ, and only there."""
    cut = {"drafter": "assistant", "gamma": 6, "draft_confidence": 0.15}
    detail = render.lane_detail("speculative", cut)
    assert detail == "assistant (reads the target's features) drafter, γ ≤ 6, cut below 0.15"
    short = Proposal(1.0, 0, "eagle", 6, (1, 2), (0.6, 0.5), 0.01, 2)
    view = render.LaneView("speculative", [short], "p", piece, 8, options=cut)  # the options, not the header's words
    assert said([view]) == (f"Step 1: the assistant drafter proposed <code>a</code> {B} and stopped there, short of "
                            "γ = 6: its probability of the whole draft fell below 0.15; the target will check all 2 "
                            "in <b>one</b> pass.")
    full = Proposal(1.0, 0, "eagle", 2, (1, 2), (0.6, 0.5), 0.01, 2)  # all the drafts asked for: nothing to explain
    assert "stopped" not in said([render.LaneView("speculative", [full], "p", piece, 8, options=cut)])
    plain = {**cut, "draft_confidence": None}
    assert "stopped" not in said([render.LaneView("speculative", [short], "p", piece, 8, options=plain)])


def test_a_repeat_avoided_and_a_neighbour_held_back_are_said():
    """no_adjacent_repeat: a revealed position whose likeliest word was its neighbour's, and a position held back
    because its neighbour got the same word in the same pass."""
    step = RefinementStep(1.0, 0, 0, (4, 6), (1, 7), (0.9, 0.8), 5, 0.01, why="2 above the confidence 0.7",
                          held=(5,), held_tokens=(7,), avoided=(4,), avoided_tokens=(2,))
    view = render.LaneView("diffusion", [step], "p", piece, 8, total_steps=8, options={"no_adjacent_repeat": True})
    text = said([view], "diffusion")
    assert ("<code>a</code> at position 5 rather than " + B + ", which its neighbour holds, or the word across the "
            "punctuation beside it (never the same word twice in a row).") in text
    assert ("<code>z</code> at position 6 held back: a token revealed beside it, or across the punctuation beside "
            "it, in this pass is the same word.") in text
    # punctuation taken out: it would stand between the same word twice ("a , a")
    step = RefinementStep(1.0, 0, 0, (4,), (7,), (0.9,), 5, 0.01, avoided=(4,), avoided_tokens=(9,))
    text = said([render.LaneView("diffusion", [step], "p", piece, 8, total_steps=8,
                                 options={"no_adjacent_repeat": True})], "diffusion")
    assert ("<code>z</code> at position 5 rather than <code>,</code>, which would repeat the punctuation beside it or "
            "stand between the same word twice (never the same word twice in a row).") in text, text


def test_a_repeated_phrase_avoided_is_said_with_the_phrase():
    """no_repeat_ngram: the phrase the likeliest token would have repeated, and why a position waited."""
    step = RefinementStep(1.0, 0, 0, (4, 6), (1, 7), (0.9, 0.8), 5, 0.01, why="2 above the confidence 0.7",
                          held=(5,), held_tokens=(7,), avoided=(4, 6), avoided_tokens=(2, 1),
                          avoided_phrases=((7, 1, 2), ()))
    view = render.LaneView("diffusion", [step], "p", piece, 8, total_steps=8,
                           options={"no_adjacent_repeat": True, "no_repeat_ngram": 3})
    text = said([view], "diffusion")
    assert ("<code>a</code> at position 5 rather than " + B + ", which would repeat <code>za<span class=\"ws\">·"
            "</span>b</code> (never the same 3 tokens twice).") in text, text
    assert "<code>z</code> at position 7 rather than <code>a</code>, which its neighbour holds" in text
    assert ("<code>z</code> at position 6 held back: with a token revealed beside it in this pass it would repeat a "
            "token or a phrase.") in text


def test_the_diffusion_header_says_when_no_word_may_come_twice_in_a_row():
    config = {"max_new_tokens": 64, "steps": 64, "block_length": 8, "threshold": 0.6, "no_adjacent_repeat": True}
    assert "sampler confidence (threshold 0.6, no word twice in a row)" in render.lane_detail("diffusion", config)
    assert "twice" not in render.lane_detail("diffusion", {**config, "no_adjacent_repeat": False})
    assert "(threshold 0.6, no word twice in a row, no 3-token phrase twice)" in render.lane_detail(
        "diffusion", {**config, "no_repeat_ngram": 3})
