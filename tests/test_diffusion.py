"""Masked-diffusion decoder: schedule, block order, threshold, reproducibility, MLM models."""

import copy

import pytest
import torch

import explorer
from explorer.diffusion import reveal_schedule
from explorer.events import RefinementStep
from explorer.models import Models


def steps_of(trace):
    return [e for e in trace.events if isinstance(e, RefinementStep)]


@pytest.mark.parametrize("n,k,block", [(16, 16, 16), (16, 8, 16), (16, 8, 4), (24, 6, 8), (12, 3, 12)])
def test_reveal_counts_follow_schedule_and_blocks_in_order(random_models, n, k, block):
    trace = explorer.decode("diffusion", random_models, "def f(x):", max_new_tokens=n, steps=k, block_length=block,
                            seed=1)
    steps = steps_of(trace)
    assert len(steps) == k == trace.stats["target_forward_passes"]
    per_block = k // (n // block)
    expected = reveal_schedule(block, per_block) * (n // block)
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
    assert sum(reveal_schedule(37, 5)) == 37


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
    trace = explorer.decode("diffusion", random_models, "abc", max_new_tokens=8, steps=4)
    first = steps_of(trace)[0]
    assert len(first.confidences) == 2 and all(0 < c <= 1 for c in first.confidences)


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


def test_masked_lm_model_without_shift():
    """Any AutoModelForMaskedLM with a mask token works (here a tiny random BERT)."""
    from transformers import BertConfig, BertForMaskedLM

    from explorer.models import Preset, build_byte_tokenizer

    tok = build_byte_tokenizer()
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)).eval()
    models = Models(Preset("bert", "random", ""), tok, bert, None, bert, tok, torch.device("cpu"), torch.float32)
    trace = explorer.decode("diffusion", models, "hello", max_new_tokens=10, steps=6, block_length=5)
    assert len(steps_of(trace)) == 6 and steps_of(trace)[-1].masks_left == 0
    assert tok.mask_token_id not in trace.token_ids


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
