"""The diffusion samplers (decoding/unmasking.py): each rule on a hand-worked pass, and through the decoder."""

import math

import pytest
import torch

import explorer
from explorer.decoding.config import DecodeConfig, validate
from explorer.decoding.diffusion import neighbours
from explorer.decoding.events import RefinementStep
from explorer.decoding.unmasking import (
    SAMPLERS,
    Pass,
    Plan,
    Words,
    across_punctuation,
    apart_ngrams,
    apart_repeats,
    ban_repeats,
    ban_words,
    bridges_repeat,
    by_confidence,
    by_entropy,
    dilated,
    entropy_bounded,
    ngram_bans,
    plan_pass,
    repeated_ngram,
    revoke,
)
from explorer.errors import ExplorerError


def make_pass(rows, masked, canvas=None, count=1, revocable=None):
    """rows: one distribution per position (over a 4-token vocabulary); the predicted token is each row's argmax."""
    probs = torch.tensor(rows, dtype=torch.float64)
    tokens = probs.argmax(-1)
    masked = torch.tensor(masked)
    canvas = torch.tensor(canvas if canvas is not None else [9] * len(rows))
    return Pass(tokens, probs.gather(-1, tokens[:, None])[:, 0], probs, masked, canvas, count,
                None if revocable is None else torch.tensor(revocable))


SURE, LIKELY, UNSURE = [0.97, 0.01, 0.01, 0.01], [0.8, 0.1, 0.05, 0.05], [0.4, 0.3, 0.2, 0.1]


def test_entropy_bound_reveals_lowest_entropy_first_while_the_sum_less_the_largest_is_within_the_bound():
    rows = [UNSURE, SURE, LIKELY, SURE, UNSURE]
    h = [-sum(p * math.log(p) for p in r) for r in rows]  # SURE 0.168, LIKELY 0.708, UNSURE 1.280
    p = make_pass(rows, [True] * 5)
    # sorted: SURE(1), SURE(3), LIKELY(2), UNSURE(0), UNSURE(4); the k-th is kept while the first k-1 sum <= bound
    assert sorted(by_entropy(p, 0.1).reveal) == [1]  # the second SURE would make the sum 0.168 > 0.1
    assert sorted(by_entropy(p, 0.2).reveal) == [1, 3]
    assert sorted(by_entropy(p, h[1] + h[3] + 1e-9).reveal) == [1, 2, 3]
    assert sorted(by_entropy(p, h[1] + h[3] + h[2] + 1e-9).reveal) == [0, 1, 2, 3]
    assert by_entropy(make_pass(rows, [True, False, True, False, True]), 0.0).reveal == (2,)  # only masked ones
    # the shared rule over a whole row, as DiffusionGemma uses it: an infinite entropy is never chosen
    assert entropy_bounded(torch.tensor([0.3, float("inf"), 0.1]), 5.0).tolist() == [True, False, True]
    assert "within the bound 0.2" in by_entropy(p, 0.2).why


def test_dilated_never_reveals_two_neighbours_in_one_pass():
    rows = [SURE, SURE, SURE, LIKELY, SURE, UNSURE]
    p = make_pass(rows, [True] * 6, count=3)
    assert by_confidence(p, 0.5).reveal == (0, 1, 2, 4, 3)  # the confidence rule takes the neighbours together
    assert dilated(p, 0.5).reveal == (0, 2, 4)  # 1 and 3 wait for the next pass
    assert dilated(p, None).reveal == (0, 2, 4)  # the schedule's count, non-adjacent
    assert dilated(make_pass(rows, [True] * 6, count=1), None).reveal == (0,)
    assert dilated(make_pass(rows, [False, True, True, True, True, True]), 0.99).reveal == (1,)  # at least one
    assert "no two adjacent" in dilated(p, 0.5).why


def test_revoke_remasks_committed_tokens_whose_probability_fell_at_most_as_many_as_revealed():
    # positions 0 and 1 were committed as token 2 ("plants plants"); this pass gives token 2 at 1 only 0.05
    rows = [[0.1, 0.1, 0.7, 0.1], [0.9, 0.03, 0.05, 0.02], SURE, SURE, UNSURE]
    p = make_pass(rows, [False, False, True, True, True], canvas=[2, 2, 9, 9, 9])
    plan = revoke(p, 0.9, 0.3)
    assert plan.reveal == (2, 3) and plan.remask == (1,)  # 0 still holds at 0.7
    assert "1 re-masked" in plan.why
    assert revoke(make_pass(rows, [False, False, True, True, True], canvas=[2, 2, 9, 9, 9]), 0.99, 0.3).remask == (1,)
    # at most as many as revealed: two fell, one revealed
    rows2 = [[0.9, 0.05, 0.03, 0.02], [0.9, 0.03, 0.05, 0.02], SURE, UNSURE]
    two_fell = make_pass(rows2, [False, False, True, True], canvas=[2, 2, 9, 9])
    assert revoke(two_fell, 0.99, 0.3).remask == (0,)  # the least likely: 0.03 < 0.05
    # a position masked again once in this block is not revocable twice
    p3 = make_pass(rows, [False, False, True, True, True], canvas=[2, 2, 9, 9, 9],
                   revocable=[True, False, False, False, False])
    assert revoke(p3, 0.9, 0.3).remask == ()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_fills_the_canvas_and_its_events_replay_to_the_output(random_models, sampler):
    options = {"threshold": 0.02} if sampler != "entropy" else {"entropy_bound": 4.0}
    if sampler == "revoke":
        options["revoke_below"] = 0.5
    trace = explorer.decode("diffusion", random_models, "def f(x):", max_new_tokens=16, block_length=8, seed=3,
                            sampler=sampler, **options)
    steps = [e for e in trace.events if isinstance(e, RefinementStep)]
    canvas = [None] * 16
    for e in steps:
        assert set(e.remasked) <= {i for i, c in enumerate(canvas) if c is not None}
        for pos in e.remasked:
            canvas[pos] = None
        for pos, tok in zip(e.positions, e.tokens, strict=True):
            assert canvas[pos] is None
            canvas[pos] = tok
        if sampler != "revoke":
            assert not e.remasked
    assert None not in canvas and steps[-1].masks_left == 0  # revocation never leaves a mask behind
    assert canvas[:len(trace.token_ids)] == trace.token_ids
    assert trace.config["sampler"] == sampler and all(e.why for e in steps)


def test_revoke_masks_again_on_a_real_decode(random_models):
    """On the random model every committed token is unlikely, so a generous revoke re-masks (bounded, and ends)."""
    trace = explorer.decode("diffusion", random_models, "def f(x):", max_new_tokens=16, block_length=8, seed=3,
                            sampler="revoke", revoke_below=0.9)  # one revealed a pass (K = N)
    steps = [e for e in trace.events if isinstance(e, RefinementStep)]
    assert sum(len(e.remasked) for e in steps) > 0
    assert len(steps) <= 2 * 16 and steps[-1].masks_left == 0


def test_a_filled_neighbours_token_is_taken_out_and_the_rest_left():
    """Hand-worked: 3 block positions over a 5-token vocabulary; position 0 sits beside 2 (left) and a mask (right),
    position 1 between 3 and 1, position 2 beside nothing filled."""
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]] * 3, dtype=torch.float64))
    left, right = torch.tensor([2, 3, -1]), torch.tensor([-1, 1, -1])
    probs = torch.softmax(ban_repeats(logits, left, right), -1)
    assert probs[0].tolist() == pytest.approx([0.1 / 0.6, 0.2 / 0.6, 0.0, 0.2 / 0.6, 0.1 / 0.6])
    assert probs[1].tolist() == pytest.approx([0.1 / 0.6, 0.0, 0.4 / 0.6, 0.0, 0.1 / 0.6])
    assert probs[2].tolist() == pytest.approx([0.1, 0.2, 0.4, 0.2, 0.1])
    # the canvas's neighbours: the answer's own, -1 for a mask, the prompt or past the end (mask id 9, prompt of 2)
    x = torch.tensor([[7, 7, 5, 9, 6, 6, 9, 4]])  # answer: 5 [M] 6 6 [M] 4
    left, right = neighbours(x, 2 + 2, 3, 2, 9)  # the block of answer positions 2..4
    assert left.tolist() == [-1, 6, 6] and right.tolist() == [6, -1, 4]
    assert neighbours(x, 2, 2, 2, 9)[0].tolist() == [-1, 5]  # the prompt's last token is not a neighbour


# a vocabulary of 7 tokens: one word in three spellings, a digit, a comma, a glued piece
PIECES = ["plants", " plants", " Plants", "0", ",", "ing", " sun"]


def test_the_same_word_is_known_in_any_spelling_and_a_glued_digit_repeats_nothing():
    """Hand-worked: "plants plants", "plants Plants" and "plantsplants" repeat a word (the right one starts a new
    word, or is a whole word glued on); "0" "0" (100) and "plants" "ing" do not; a comma repeats only itself."""
    words = Words.of(PIECES)
    assert words.key.tolist() == [0, 0, 0, 1, -1, 2, 3]
    assert words.starts.tolist() == [False, True, True, False, False, False, True]
    assert words.repeat(0, 1) and words.repeat(1, 2) and words.repeat(2, 1)
    assert words.repeat(1, 0) and words.repeat(0, 0)  # "plantsplants": a whole word glued to itself
    assert not words.repeat(3, 3) and words.repeat(4, 4) and not words.repeat(0, 5)
    # a short piece glued to itself is no repeat ("is" "is": Isis), a whole word of three letters is ("setset")
    short = Words.of(["is", " is", "set", " set"])
    assert short.whole.tolist() == [False, False, True, True]
    assert not short.repeat(1, 0) and short.repeat(1, 1) and short.repeat(3, 2) and short.repeat(2, 2)
    assert short.after(3).tolist() == [False, False, True, True] and short.before(0).tolist() == [False] * 4
    # the bans: right of "plants", every spelling (glued too); left of " Plants", every spelling
    logits = torch.zeros(2, 7)
    out = ban_repeats(logits, torch.tensor([0, -1]), torch.tensor([-1, 2]), words)
    assert torch.isneginf(out[0]).tolist() == [True, True, True, False, False, False, False]
    assert torch.isneginf(out[1]).tolist() == [True, True, True, False, False, False, False]
    out = ban_repeats(logits, torch.tensor([3, 4]), torch.tensor([3, -1]), words)  # digits glue; a comma
    assert torch.isneginf(out).nonzero().tolist() == [[1, 4]]
    # revealed together: " plants" then " Plants" is one held back, "0" "0" both go
    confidence = torch.tensor([0.9, 0.8, 0.7], dtype=torch.float64)
    assert apart_repeats(Plan((0, 1, 2)), torch.tensor([1, 2, 6]), confidence, words).held == (1,)
    assert apart_repeats(Plan((0, 1, 2)), torch.tensor([3, 3, 6]), confidence, words).held == ()
    assert apart_repeats(Plan((0, 1, 2)), torch.tensor([3, 3, 6]), confidence).held == (1,)  # no words: the token


def test_the_word_across_punctuation_is_found_on_either_side_within_reach():
    """Hand-worked on PIECES: in "plants , [mask]" the word left of the mask across the comma is "plants" (0); in
    "[mask] , , , , sun" four commas are past the reach of 3; a masked token between ends the search; a word right
    beside the mask is the neighbour's ban, not this one (-1)."""
    words = Words.of(PIECES)
    assert across_punctuation([0, 4, -1], 2, -1, words) == 0
    assert across_punctuation([-1, 4, 6], 0, 1, words) == 6
    assert across_punctuation([-1, 4, 4, 4, 6], 0, 1, words) == 6
    assert across_punctuation([-1, 4, 4, 4, 4, 6], 0, 1, words) == -1
    assert across_punctuation([0, -1, 4, -1], 3, -1, words) == -1
    assert across_punctuation([0, -1], 1, -1, words) == -1
    # across the comma every spelling is out, "plants" without a space too (after punctuation it starts a word)
    out = ban_words(torch.zeros(2, 7), [(across_punctuation([0, 4, -1], 2, -1, words), -1), (-1, 3)], words)
    assert torch.isneginf(out).tolist() == [[True, True, True, False, False, False, False],
                                            [False, False, False, True, False, False, False]]  # "0 , 0" too


def test_punctuation_between_two_equal_words_is_found_and_banned():
    """Hand-worked on PIECES: in "plants [mask] Plants" and "plants , [mask] plants" the mask would join one word's
    two spellings with 1-2 tokens that are no word; four tokens between are past the reach of 3; two different
    words, or a mask beyond, join nothing. The ban takes every token that is no word out of that position only."""
    words = Words.of(PIECES)
    assert bridges_repeat([1, -1, 2], 1, words) and bridges_repeat([0, 4, -1, 1], 2, words)
    assert bridges_repeat([0, 4, 4, -1, 1], 3, words) and not bridges_repeat([0, 4, 4, -1, 4, 1], 3, words)
    assert not bridges_repeat([0, -1, 6], 1, words) and not bridges_repeat([0, -1, -1, 0], 1, words)
    out = ban_words(torch.zeros(2, 7), [(-1, -1), (-1, -1)], words, [False, True])
    assert torch.isneginf(out).tolist() == [[False] * 7, [False, False, False, False, True, False, False]]


def test_a_pass_reveals_no_word_that_repeats_one_across_punctuation_revealed_with_it_or_there():
    """Hand-worked on PIECES, tokens " plants" "," " Plants" chosen at 0, 1, 2, the most confident first: the comma
    goes on beside "plants" (no repeat), then " Plants" would repeat "plants" across it and is held back; with the
    comma already on the canvas and 0, 2 revealed, the same; with no word table, only equal neighbours count."""
    words, confidence = Words.of(PIECES), torch.tensor([0.9, 0.8, 0.7], dtype=torch.float64)
    tokens = torch.tensor([1, 4, 2])
    assert apart_repeats(Plan((0, 1, 2)), tokens, confidence, words, [-1, -1, -1]).held == (2,)
    assert apart_repeats(Plan((0, 2)), tokens, confidence, words, [-1, 4, -1]).held == (2,)
    assert apart_repeats(Plan((0, 1, 2)), tokens, confidence, None, [-1, -1, -1]).held == ()
    assert apart_repeats(Plan((0, 2)), torch.tensor([1, 4, 6]), confidence, words, [-1, 4, -1]).held == ()
    # the comma revealed last, between two spellings already kept: held back
    assert apart_repeats(Plan((0, 1, 2)), tokens, torch.tensor([0.9, 0.6, 0.7], dtype=torch.float64), words,
                         [-1, -1, -1]).held == (1,)


def test_two_neighbours_with_the_same_token_are_not_revealed_in_one_pass():
    """Hand-worked: the rule chose 0..3 with tokens 5 5 7 5; 1 is the most confident, so 0 (a 5 beside it) waits;
    3 (a 5 beside 7) and 2 stay."""
    tokens, confidence = torch.tensor([5, 5, 7, 5]), torch.tensor([0.9, 0.95, 0.8, 0.85], dtype=torch.float64)
    plan = apart_repeats(Plan((0, 1, 2, 3), why="4 above"), tokens, confidence)
    assert plan.reveal == (1, 2, 3) and plan.held == (0,) and plan.why == "4 above; 1 held back beside the same word"
    # a revoke plan keeps at most as many re-masked as revealed
    plan = apart_repeats(Plan((0, 1), (3, 2)), torch.tensor([5, 5, 1, 1]), confidence)
    assert plan.reveal == (1,) and plan.remask == (3,) and plan.held == (0,)
    assert apart_repeats(Plan((0, 2)), tokens, confidence).held == ()  # not neighbours
    # through plan_pass: only with a penalty
    p = make_pass([SURE, SURE, UNSURE], [True, True, True])
    assert plan_pass(p, DecodeConfig(threshold=0.5)).reveal == (0, 1)
    assert plan_pass(p, DecodeConfig(threshold=0.5, no_adjacent_repeat=True)).reveal == (0,)


def test_no_adjacent_repeat_in_a_decode_leaves_no_equal_neighbours_and_ends_filled(random_models):
    trace = explorer.decode("diffusion", random_models, "def f(x):", max_new_tokens=16, block_length=8, seed=3,
                            threshold=0.02, no_adjacent_repeat=True)
    steps = [e for e in trace.events if isinstance(e, RefinementStep)]
    canvas = [None] * 16
    for e in steps:
        together = dict(zip(e.positions, e.tokens, strict=True))
        assert not any(together.get(p + 1) == t for p, t in together.items())
        for pos, tok in together.items():
            canvas[pos] = tok
    assert None not in canvas and steps[-1].masks_left == 0
    assert all(a != b for a, b in zip(canvas, canvas[1:], strict=False))  # nor one predicted beside a filled one
    assert trace.config["no_adjacent_repeat"] is True


def test_a_token_that_would_complete_an_ngram_the_answer_holds_is_banned_on_either_side():
    """Hand-worked, n = 3: the answer 1 2 3 [M] 1 2 [M] 2 3 holds one whole 3-gram, (1 2 3). Position 6 would make
    (1 2 _) with its left pair (3 banned) and (_ 2 3) with its right pair (1 banned); position 3 completes nothing."""
    answer = [1, 2, 3, -1, 1, 2, -1, 2, 3]
    assert ngram_bans(answer, range(9), 3) == {6: {1, 3}}
    assert ngram_bans(answer, range(4), 3) == {}  # only the block's positions
    assert ngram_bans(answer, range(9), 2) == {6: {1, 3}}  # (2 3) and (1 2) are held; nothing pairs 3 _ or _ 1
    # an answer's end repeats (end-of-turn padding): a free token is never part of a banned n-gram
    ended = [9, 9, 9, -1, 9, 9]
    assert ngram_bans(ended, range(6), 3) == {3: {9}} and ngram_bans(ended, range(6), 3, frozenset({9})) == {}
    assert repeated_ngram([1, 2, 3, 1, 2, 3], 4, 3) == (1, 2, 3) and repeated_ngram([1, 2, 3, 1, 2, 4], 4, 3) == ()


def test_tokens_revealed_together_never_make_a_repeated_ngram():
    """Hand-worked, n = 3: the answer 1 2 [M] [M] 1 2 [M] [M]; the rule chose 2, 3, 6, 7 with tokens 3, 7, 3, 8 and
    6 the most confident. 6 goes first (1 2 3 at 4..6); 2 would repeat it and waits; 3 and 7 make nothing twice."""
    tokens = torch.tensor([0, 0, 3, 7, 0, 0, 3, 8])
    confidence = torch.tensor([0, 0, 0.9, 0.85, 0, 0, 0.95, 0.8], dtype=torch.float64)
    masked = torch.tensor([False, False, True, True, False, False, True, True])
    p = Pass(tokens, confidence, torch.zeros(8, 4, dtype=torch.float64), masked, tokens, 1,
             answer=(1, 2, -1, -1, 1, 2, -1, -1))
    plan = apart_ngrams(Plan((2, 3, 6, 7), why="4 above"), p, 3)
    assert plan.reveal == (3, 6, 7) and plan.held == (2,) and plan.why == "4 above; 1 held back: a repeated 3-gram"
    # the most confident is always revealed: with 2 first, 6 waits
    swapped = torch.tensor([0, 0, 0.95, 0.85, 0, 0, 0.9, 0.8], dtype=torch.float64)
    first = Pass(tokens, swapped, p.probs, masked, tokens, 1, answer=p.answer)
    assert apart_ngrams(Plan((2, 6)), first, 3).reveal == (2,)
    assert apart_ngrams(Plan((2, 6)), p, 4).held == ()  # no 4-gram twice
    assert plan_pass(p, DecodeConfig(threshold=0.5, no_repeat_ngram=3)).held == (2,)
    assert plan_pass(p, DecodeConfig(threshold=0.5)).held == ()


@pytest.mark.parametrize("options", [{"threshold": 0.02}, {"steps": 32}], ids=["many a pass", "one a pass"])
def test_no_repeat_ngram_in_a_decode_leaves_no_ngram_twice_and_ends_filled(random_models, options):
    """The random miniature's answers repeat 2-grams (checked first); with the ban, none, and every position filled.
    One token a pass: only the ban stops a repeat (no two revealed together)."""
    def grams(tokens):
        return [tuple(tokens[i:i + 2]) for i in range(len(tokens) - 1)]

    options = {"max_new_tokens": 32, "block_length": 8, **options}
    plain = [explorer.decode("diffusion", random_models, "def f(x):", seed=s, **options) for s in range(3)]
    assert any(len(set(grams(t.token_ids))) < len(grams(t.token_ids)) for t in plain), "no repeat to stop"
    free = {random_models.diffusion_tokenizer.eos_token_id, random_models.diffusion_tokenizer.pad_token_id}
    for seed in range(3):
        trace = explorer.decode("diffusion", random_models, "def f(x):", seed=seed, no_repeat_ngram=2, **options)
        steps = [e for e in trace.events if isinstance(e, RefinementStep)]
        whole = [g for g in grams(trace.token_ids) if not free & set(g)]
        assert len(set(whole)) == len(whole), trace.token_ids
        assert steps[-1].masks_left == 0 and trace.config["no_repeat_ngram"] == 2
        assert all(len(e.avoided_phrases) == len(e.avoided) for e in steps)


@pytest.mark.parametrize("options,message", [
    ({"no_adjacent_repeat": 1}, "no_adjacent_repeat"),
    ({"no_repeat_ngram": 1}, "no_repeat_ngram"), ({"no_repeat_ngram": 9}, "no_repeat_ngram"),
    ({"no_repeat_ngram": True}, "no_repeat_ngram"),
    ({"sampler": "greedy"}, "unknown sampler"), ({"sampler": "entropy", "entropy_bound": 0}, "entropy_bound"),
    ({"sampler": "entropy", "entropy_bound": float("nan")}, "entropy_bound"),
    ({"sampler": "revoke", "revoke_below": 1.0}, "revoke_below"),
    ({"sampler": "confidence", "revoke_below": 0.3}, "revoke sampler's")])
def test_sampler_options_are_validated(options, message):
    with pytest.raises(ExplorerError, match=message):
        validate("diffusion", DecodeConfig(**options))
