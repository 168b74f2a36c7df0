"""Masked-diffusion decoder: schedule, block order, threshold, reproducibility, MLM models."""

import copy
import types

import numpy as np
import pytest
import torch

import explorer
from explorer.decoding.config import DecodeConfig
from explorer.decoding.diffusion import predict_tokens, reveal_schedule
from explorer.decoding.events import RefinementStep
from explorer.decoding.sampling import make_generator
from explorer.decoding.unmasking import Pass, Plan, by_confidence
from explorer.runtime import Models


def steps_of(trace):
    return [e for e in trace.events if isinstance(e, RefinementStep)]


@pytest.mark.parametrize("n,k,block,expected", [
    (16, 16, 16, [1] * 16), (16, 8, 16, [2] * 8), (16, 8, 4, [2, 2] * 4), (24, 6, 8, [4, 4] * 3),
    (12, 3, 12, [4, 4, 4]), (10, 4, 10, [3, 3, 2, 2]), (20, 6, 10, [4, 3, 3] * 2)])
def test_reveal_counts_follow_schedule_and_blocks_in_order(random_models, n, k, block, expected):
    trace = explorer.decode("diffusion", random_models, "def f(x):", max_new_tokens=n, steps=k, block_length=block,
                            seed=1)
    steps = steps_of(trace)
    assert len(steps) == k == trace.stats["target_forward_passes"]
    assert [len(s.positions) for s in steps] == expected
    assert steps[-1].masks_left == 0
    canvas = [None] * n
    for s in steps:
        for pos, tok in zip(s.positions, s.tokens, strict=True):
            assert canvas[pos] is None, "a revealed position was revealed again"
            assert pos // block == s.block
            canvas[pos] = tok
    assert None not in canvas and random_models.mask_token_id not in canvas
    blocks = [s.block for s in steps]
    assert blocks == sorted(blocks), "a later block revealed before an earlier block was complete"


def test_reveal_schedule_is_linear_with_remainder_first():
    assert reveal_schedule(10, 4) == [3, 3, 2, 2]
    assert reveal_schedule(37, 5) == [8, 8, 7, 7, 7]


def choose_positions(conf, masked, count, threshold):
    probs = torch.eye(len(conf), dtype=torch.float64)
    return torch.tensor(by_confidence(Pass(torch.arange(len(conf)), conf, probs, masked, torch.zeros(len(conf)),
                                          count), threshold).reveal)


def test_choose_positions_most_confident_first_and_threshold():
    conf = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.3], dtype=torch.float64)
    every = torch.ones(5, dtype=torch.bool)
    assert sorted(choose_positions(conf, every, 2, None).tolist()) == [1, 3]
    masked = torch.tensor([True, False, True, True, True])  # position 1 already revealed
    assert sorted(choose_positions(conf, masked, 2, None).tolist()) == [2, 3]
    assert sorted(choose_positions(conf, every, 1, 0.4).tolist()) == [1, 2, 3]  # all above 0.4, count ignored
    assert sorted(choose_positions(conf, every, 1, 0.6).tolist()) == [1, 3]
    assert choose_positions(conf, every, 3, 0.95).tolist() == [1]  # none above: the most confident one
    assert sorted(choose_positions(conf, masked, 9, None).tolist()) == [0, 2, 3, 4]  # never more than masked


class PositionLogits(torch.nn.Module):
    """A denoiser whose logits depend only on the position: row j is ``strength[j]`` on token 10 + j."""

    def __init__(self, vocab, strength):
        super().__init__()
        self.vocab, self.strength = vocab, torch.tensor(strength, dtype=torch.float32)
        self.config = types.SimpleNamespace(max_position_embeddings=512, mask_token_id=None)

    def forward(self, input_ids, **kwargs):
        length = input_ids.shape[1]
        logits = torch.zeros(1, length, self.vocab)
        logits[0, torch.arange(length), 10 + torch.arange(length)] = self.strength[:length]
        return types.SimpleNamespace(logits=logits)


def position_models(random_models, strength, shift):
    tok = random_models.tokenizer
    model = PositionLogits(len(tok), strength)
    return Models(random_models.preset, tok, random_models.target, None, model, tok, torch.device("cpu"),
                  torch.float32, diffusion_shift=shift)


def reference_confidence(strength, vocab, banned=2):
    """max softmax of a row holding one logit s and zeros elsewhere (the banned mask/pad tokens excluded)."""
    s = np.asarray(strength, dtype=float)
    return np.exp(s) / (np.exp(s) + vocab - banned - 1)


STRENGTH_NEW = [1.0, 7.0, 2.0, 8.0, 3.0, 0.0, 10.0, 9.0]  # for the 8 new positions after the 3-token prompt "abc"


def test_first_step_reveals_the_most_confident_positions(random_models):
    models = position_models(random_models, [0.0] * 3 + STRENGTH_NEW, shift=False)
    trace = explorer.decode("diffusion", models, "abc", max_new_tokens=8, steps=4)
    first = steps_of(trace)[0]
    assert sorted(first.positions) == [6, 7]  # strengths 10 and 9
    conf = reference_confidence(STRENGTH_NEW, len(random_models.tokenizer))
    assert np.allclose(sorted(first.confidences), sorted(conf[[6, 7]]))


def test_first_step_with_threshold_reveals_every_position_above_it(random_models):
    models = position_models(random_models, [0.0] * 3 + STRENGTH_NEW, shift=False)
    conf = reference_confidence(STRENGTH_NEW, len(random_models.tokenizer))
    for threshold in (0.9, 0.8, 0.5):
        trace = explorer.decode("diffusion", models, "abc", max_new_tokens=8, steps=8, threshold=threshold)
        assert sorted(steps_of(trace)[0].positions) == np.flatnonzero(conf > threshold).tolist(), threshold


@pytest.mark.parametrize("shift", [False, True])
def test_greedy_decoding_is_the_argmax_of_the_right_logits(random_models, shift):
    """Masked-LM: token j is the argmax of row j; a shifted (Dream-style) model: of row j - 1."""
    strength = [5.0] * 11
    models = position_models(random_models, strength, shift=shift)
    trace = explorer.decode("diffusion", models, "abc", max_new_tokens=8, steps=8, temperature=0.0)
    rows = np.arange(3, 11) - (1 if shift else 0)  # absolute rows that predict new positions 0..7
    assert trace.token_ids == (10 + rows).tolist()


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_seeded_runs_are_reproducible(random_models, remasking):
    kw = dict(max_new_tokens=12, steps=6, temperature=0.9, remasking=remasking)
    a = explorer.decode("diffusion", random_models, "abc", seed=5, **kw)
    b = explorer.decode("diffusion", random_models, "abc", seed=5, **kw)
    c = explorer.decode("diffusion", random_models, "abc", seed=6, **kw)
    assert a.token_ids == b.token_ids
    assert [s.positions for s in steps_of(a)] == [s.positions for s in steps_of(b)]
    assert a.token_ids != c.token_ids or [s.positions for s in steps_of(a)] != [s.positions for s in steps_of(c)]


def test_low_confidence_reveals_the_most_confident_first(random_models):
    """On a real model: the two revealed positions are the two most confident of the first pass."""
    models = random_models
    trace = explorer.decode("diffusion", models, "abc", max_new_tokens=8, steps=4)
    first = steps_of(trace)[0]
    ids = models.tokenizer("abc").input_ids + [models.mask_token_id] * 8
    with torch.inference_mode():
        logits = models.diffusion(torch.tensor([ids])).logits[0].double()
    logits = torch.cat([logits[:1], logits[:-1]])[3:]  # shifted: row j - 1 predicts j
    logits[:, [models.mask_token_id, models.tokenizer.pad_token_id]] = float("-inf")
    conf = torch.softmax(logits, -1).max(-1).values.numpy()
    assert sorted(first.positions) == sorted(np.argsort(-conf)[:2].tolist())


def confident(models):
    """A copy of the diffusion model with a sharpened head: near-certain predictions."""
    model = copy.deepcopy(models.diffusion)
    with torch.no_grad():
        model.lm_head.weight.mul_(50)
    return Models(models.preset, models.tokenizer, models.target, models.draft, model, models.diffusion_tokenizer,
                  models.device, models.dtype, diffusion_shift=True)


def test_threshold_uses_fewer_passes_on_a_confident_model(random_models):
    models = confident(random_models)
    trace = explorer.decode("diffusion", models, "abc", max_new_tokens=16, steps=16, threshold=0.9)
    assert trace.stats["target_forward_passes"] < 16
    assert steps_of(trace)[-1].masks_left == 0
    assert all(len(s.positions) >= 1 for s in steps_of(trace))


def test_threshold_reveals_at_least_one_when_nothing_is_confident(random_models):
    trace = explorer.decode("diffusion", random_models, "abc", max_new_tokens=8, steps=8, threshold=1.0)
    assert [len(s.positions) for s in steps_of(trace)] == [1] * 8


def tiny_bert_models() -> Models:
    """A seeded random 1-layer BERT (an AutoModelForMaskedLM with a mask token) as target and denoiser."""
    from transformers import BertConfig, BertForMaskedLM

    from explorer.runtime import Preset, build_byte_tokenizer

    tok = build_byte_tokenizer()
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)).eval()
    return Models(Preset("bert", "random", ""), tok, bert, None, bert, tok, torch.device("cpu"), torch.float32)


def test_masked_lm_model_without_shift():
    """Any AutoModelForMaskedLM with a mask token works (here a tiny random BERT)."""
    models = tiny_bert_models()
    trace = explorer.decode("diffusion", models, "hello", max_new_tokens=10, steps=6, block_length=5)
    assert len(steps_of(trace)) == 6 and steps_of(trace)[-1].masks_left == 0
    assert models.tokenizer.mask_token_id not in trace.token_ids


def test_diffusion_is_bidirectional(random_models):
    """Changing a later position changes the prediction at an earlier one (not a causal model)."""
    model = random_models.diffusion
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    other = ids.clone()
    other[0, -1] = 40
    with torch.inference_mode():
        a, b = model(ids).logits[0, 0], model(other).logits[0, 0]
    assert not torch.allclose(a, b)


def test_streaming_times_are_monotone(random_models):
    trace = explorer.decode("diffusion", random_models, "abc", max_new_tokens=16, steps=8, block_length=8)
    t = trace.token_times
    assert len(t) == len(trace.token_ids) and t == sorted(t)
    assert trace.stats["ttft_s"] == t[0]


@pytest.mark.parametrize("options", [{"steps": 64}, {"steps": 64, "threshold": 0.9}, {"steps": 32, "cache": "none"}])
def test_the_decode_stops_when_the_answer_has_ended_with_the_same_output(options):
    """Once end-of-turn is revealed and everything before it is filled, the output (cut at EOS) is final: the
    decode stops there instead of filling the canvas with end tokens, gives the same tokens as decoding on,
    and its stats count only the passes it made."""
    from explorer.decoding.api import encode_prompt
    from explorer.decoding.config import DecodeConfig
    from explorer.decoding.diffusion import decode_diffusion

    models = explorer.load_models("smollm2-135m")
    cfg = DecodeConfig(max_new_tokens=64, block_length=8, **options)
    eos = models.diffusion_tokenizer.eos_token_id

    def run(ids, stop: bool):
        gen, events = decode_diffusion(models, ids, cfg, stop_at_end=stop), []
        try:
            while True:
                events.append(next(gen))
        except StopIteration as done:
            return done.value, events

    # short answers, so that one ends inside the canvas (which one may change with a retrained adapter, or with a
    # near-tie that bf16 rounds either way); every prompt must give the same tokens whether the decode stops or not
    for prompt in ("Answer in one word: what colour is the sky?", "Say hello.", "Name one colour."):
        ids = list(encode_prompt(models.diffusion_tokenizer, prompt, True)[0])
        (short, short_events), (full, full_events) = run(ids, True), run(ids, False)
        assert short.tokens == full.tokens
        if short.tokens[-1] == eos and len(short.tokens) < 64:
            break
    else:
        raise AssertionError("no prompt's answer ended inside the 64-token canvas: nothing to stop early")
    assert short.target_passes == len(short_events) < full.target_passes == len(full_events)
    trace = explorer.decode("diffusion", models, prompt, max_new_tokens=64, block_length=8, **options)
    assert trace.token_ids == short.tokens
    assert trace.stats["target_forward_passes"] == len([e for e in trace.events if isinstance(e, RefinementStep)])


@pytest.mark.parametrize("bad", ["none", "revealed", "remask-more"])
def test_a_pass_that_reveals_nothing_raises_within_one_pass_instead_of_hanging(random_models, monkeypatch, bad):
    from explorer.decoding import diffusion as diffusion_module

    real = diffusion_module.plan_pass
    calls, bad_calls = [], []

    def broken(p, cfg):
        calls.append(1)
        revealed = [int(i) for i in (~p.masked).nonzero()[:, 0]]
        if len(revealed) < 2:
            return real(p, cfg)  # the first passes are fine
        bad_calls.append(len(calls))
        if bad == "none":
            return Plan(())
        if bad == "revealed":
            return Plan(tuple(revealed[:1]))  # a position revealed already
        masked = [int(i) for i in p.masked.nonzero()[:, 0]]
        return Plan(tuple(masked[:1]), tuple(revealed[:2]))  # more re-masked than revealed: fewer masks never come

    monkeypatch.setattr(diffusion_module, "plan_pass", broken)
    with pytest.raises(explorer.ExplorerError, match="a pass must reveal masked positions") as info:
        explorer.decode("diffusion", random_models, "abc", max_new_tokens=8, steps=8, block_length=8)
    assert bad_calls == [len(calls)] and "\n" not in str(info.value)  # raised in the pass that did it


class FavouriteLogits(torch.nn.Module):
    """A denoiser whose row j prefers ``first[j]`` (logit ``strength[j]``, 10 by default), then ``second`` (logit 5)."""

    def __init__(self, vocab, first, second, strength=None):
        super().__init__()
        self.vocab, self.first, self.second = vocab, torch.tensor(first), second
        self.strength = torch.tensor(strength if strength is not None else [10.0] * len(first))
        self.config = types.SimpleNamespace(max_position_embeddings=512, mask_token_id=None)

    def forward(self, input_ids, **kwargs):
        length = input_ids.shape[1]
        logits = torch.zeros(1, length, self.vocab)
        logits[..., self.second] = 5.0
        logits[0, torch.arange(length), self.first[:length]] = self.strength[:length]
        return types.SimpleNamespace(logits=logits)


def test_no_word_twice_in_a_row_looks_across_punctuation(random_models):
    """Hand-worked, byte tokens, revealed left to right: a denoiser that wants "a" "," "a" after the prompt "x" writes
    "a,a" without the ban and "a,b" with it (the word across the comma is "a"); "a" "a" glued is one word ("aa")."""
    tok = random_models.tokenizer
    (x,), (a,), (comma,), (b,) = (tok(t).input_ids for t in ("x", "a", ",", "b"))
    def decode(favourite, **ban):
        models = Models(random_models.preset, tok, random_models.target, None,
                        FavouriteLogits(len(tok), [x, *favourite], b), tok, torch.device("cpu"), torch.float32)
        n = len(favourite)
        return explorer.decode("diffusion", models, "x", max_new_tokens=n, steps=n, block_length=1, cache="none",
                               **ban).token_ids
    assert decode([a, comma, a]) == [a, comma, a]
    assert decode([a, comma, a], no_adjacent_repeat=True) == [a, comma, b]
    assert decode([a, a], no_adjacent_repeat=True) == [a, a]


def test_no_punctuation_between_two_equal_words_nor_a_repeat_revealed_at_once(random_models):
    """Hand-worked, byte tokens, one block of 3 after the prompt "x", a denoiser that wants "a" "," "a":
    - one position a pass, the comma least sure: "a" at 0, then "a" at 2, then 1 would join them ("a,a"): the ban
      takes out every token that is no word there, so the next favourite, "b", goes between: "aba";
    - every position in one pass (threshold; the comma surer than the second "a"): the second "a" would repeat the
      first across the comma revealed with it, so it is held back, and the next pass, which sees "a," on its left,
      writes "b": "a,b"."""
    tok = random_models.tokenizer
    (x,), (a,), (comma,), (b,) = (tok(t).input_ids for t in ("x", "a", ",", "b"))
    def decode(strength, **options):
        models = Models(random_models.preset, tok, random_models.target, None,
                        FavouriteLogits(len(tok), [x, a, comma, a], b, [10.0, 10.0, *strength]), tok,
                        torch.device("cpu"), torch.float32)
        return explorer.decode("diffusion", models, "x", max_new_tokens=3, block_length=3, cache="none",
                               **options).token_ids
    assert decode([7.0, 10.0], steps=3) == [a, comma, a]
    assert decode([7.0, 10.0], steps=3, no_adjacent_repeat=True) == [a, b, a]
    assert decode([10.0, 9.0], threshold=0.5) == [a, comma, a]
    assert decode([10.0, 9.0], threshold=0.5, no_adjacent_repeat=True) == [a, comma, b]


def test_no_word_twice_in_a_row_still_writes_a_number_with_a_repeated_digit():
    """SmolLM2 writes 1000 as four digit tokens: a ban of the neighbour's token would give "1090"; a ban of the
    neighbour's word lets a digit follow the same digit, and still never "plants plants" (its two spellings)."""
    from explorer.measure.workload import adjacent_repeat_rate

    models = explorer.load_models("smollm2-135m")
    options = {"max_new_tokens": 32, "steps": 32, "block_length": 8, "threshold": 0.6, "no_adjacent_repeat": True}
    trace = explorer.decode("diffusion", models, "How many years are in a millennium? Answer with the number.",
                            **options)
    assert "1000" in trace.text, trace.text
    assert adjacent_repeat_rate(trace.text) == 0, trace.text


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_a_pass_that_samples_only_its_masked_rows_draws_what_the_whole_block_would(remasking):
    """predict_tokens with ``live`` rows: each live row's token, confidence and distribution are those of the same
    seeded call over every row (the random draws are the whole block's, then the live rows'), the other rows empty.
    Drawing noise for the live rows alone would give other samples (it fails here)."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    live = torch.tensor([False, True, False, True, True, False])
    cfg = DecodeConfig(temperature=1.0, remasking=remasking)
    kept = logits.clone()
    full = predict_tokens(logits, cfg, make_generator(5), [])
    some = predict_tokens(logits, cfg, make_generator(5), [], live)
    assert torch.equal(logits, kept)  # the caller's logits are left as they were
    for a, b in zip(full, some, strict=True):
        assert torch.equal(a[live], b[live])
    assert some[0][~live].eq(0).all() and some[1][~live].eq(0).all() and some[2][~live].eq(0).all()


def test_a_greedy_pass_ranked_by_confidence_alone_takes_the_same_tokens_without_distributions():
    """predict_tokens(probs=False) at T = 0 (the confidence and dilated samplers: no rule of theirs reads the
    distributions): the tokens of the float64 pass, the confidences within float32 rounding of its, no (B, V)
    distributions, the other rows empty; banned tokens stay out."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    logits[2, 7] = 40.0  # a row whose favourite is banned
    live = torch.tensor([True, True, True, False, True, False])
    cfg = DecodeConfig(temperature=0.0)
    kept = logits.clone()
    for rows in (None, live):
        tokens, confidence, probs = predict_tokens(logits, cfg, make_generator(0), [7], rows, probs=False)
        full = predict_tokens(logits, cfg, make_generator(0), [7], rows)
        assert probs is None and torch.equal(logits, kept)
        assert torch.equal(tokens, full[0]) and int(tokens[2]) != 7
        assert confidence.dtype == torch.float64 and torch.allclose(confidence, full[1], rtol=1e-6, atol=0)
