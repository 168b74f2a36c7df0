"""The diffusion drafter (exact against references) and the diffusion KV cache (Fast-dLLM Sec. 3.1).

Drafter: greedy speculative decoding with it equals autoregressive decoding token for token, and
at temperature > 0 the first two tokens follow the exact target distribution (chi-square, with a
negative control). Cache: the positions fed per pass drop as the mode says, a cache refilled
before every step gives exactly the output of no cache, and bad options get one clear error.
"""

import copy
import dataclasses
import itertools
import types

import numpy as np
import pytest
import torch

import explorer
from explorer.decoding import drafters, speculative
from explorer.decoding.config import DecodeConfig
from explorer.decoding.diffusion import decode_diffusion
from explorer.errors import ExplorerError
from explorer.families.random_tiny import build_random_llama
from explorer.runtime import Models, Preset, build_byte_tokenizer, make_bidirectional
from tests.test_speculative_exact import PROMPTS, chi_square_p, exact_two_token_distribution

VOCAB, TEMPERATURE, TOP_K, SAMPLES = 8, 0.7, 4, 1500


def run(gen):
    events = []
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        return stop.value, events


@pytest.fixture(scope="module")
def aligned_models(random_models):
    """random-tiny with its (causal) draft model standing in as the denoiser: its first drafted token
    is usually the target's, so the accept path runs as well as the reject path."""
    return dataclasses.replace(random_models, diffusion=random_models.draft, diffusion_shift=True)


@pytest.mark.parametrize("which", ["bidirectional", "aligned"])
def test_greedy_speculative_with_diffusion_drafter_equals_autoregressive(random_models, aligned_models, which):
    models = random_models if which == "bidirectional" else aligned_models
    accepted = rejected = 0
    for prompt in PROMPTS[:3]:
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=12)
        for gamma, (passes, cache) in itertools.product([1, 3, 8], [(1, "none"), (3, "dual")]):
            spec = explorer.decode("speculative", models, prompt, max_new_tokens=12, gamma=gamma,
                                   drafter="diffusion", draft_passes=passes, cache=cache)
            assert spec.token_ids == ar.token_ids, (prompt, gamma, passes, cache)
            accepted += spec.stats["accepted"]
            rejected += spec.stats["proposed"] - spec.stats["accepted"]
    assert rejected > 0
    if which == "aligned":
        assert accepted > 0, "the accept path must be exercised"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_causal_denoiser_one_pass_per_token_drafts_what_the_model_drafter_drafts(aligned_models, temperature):
    """A reference for the drafter's plumbing (positions, logit shift, prefix cache): with a causal model as
    the denoiser and one pass per drafted token, it is the model drafter, draw for draw."""
    for prompt, gamma in itertools.product(PROMPTS[:3], [2, 4]):
        kw = dict(max_new_tokens=12, gamma=gamma, temperature=temperature, seed=3)
        model = explorer.decode("speculative", aligned_models, prompt, drafter="model", **kw)
        diffusion = explorer.decode("speculative", aligned_models, prompt, drafter="diffusion", draft_passes=gamma,
                                    **kw)
        assert diffusion.token_ids == model.token_ids
        assert final_drafts(diffusion) == final_drafts(model)


def final_drafts(trace):
    """The complete draft of each step (a refining drafter's last Proposal of the step)."""
    return list({e.step: e.tokens for e in trace.events if isinstance(e, explorer.decoding.events.Proposal)}.values())


def test_refining_draft_yields_one_proposal_per_pass(random_models):
    trace = explorer.decode("speculative", random_models, "abc", max_new_tokens=9, gamma=4, drafter="diffusion",
                            draft_passes=2, temperature=0.8, seed=1)
    proposals = [e for e in trace.events if isinstance(e, explorer.decoding.events.Proposal)]
    assert sum(p.draft_passes for p in proposals) == trace.stats["draft_forward_passes"]
    by_step = {}
    for p in proposals:
        by_step.setdefault(p.step, []).append(p)
    assert any(len(ps) == 2 for ps in by_step.values())
    for ps in by_step.values():  # the committed head of the draft stays put while the rest is refined
        if len(ps) == 2:
            assert ps[1].tokens[:2] == ps[0].tokens[:2] and len(ps[0].tokens) >= len(ps[1].tokens)


# ------------------------------------------------------------------------------------------
# statistical exactness (vocabulary of 8: the exact two-token distribution by enumeration)

@pytest.fixture(scope="module")
def small_vocab_models():
    """The target, and a noisy bidirectional copy of it as the denoiser: its drafts overlap the target's
    distribution without equalling it, so accepts, rejects and residual draws all matter. The mask (6)
    is a token the target does not sample after the prompt."""
    target = build_random_llama(VOCAB, 16, 1, seed=11, std=0.6).eval()
    diffusion = copy.deepcopy(target)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for p in diffusion.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    make_bidirectional(diffusion)
    tokenizer = types.SimpleNamespace(eos_token_id=None, mask_token_id=6, pad_token_id=None)
    return Models(Preset("stat", "random", ""), tokenizer, target, None, diffusion, tokenizer, torch.device("cpu"),
                  torch.float32, diffusion_shift=True)


def sample_two_tokens(models, prompt_ids, passes):
    counts = np.zeros((VOCAB, VOCAB))
    for seed in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=2, temperature=TEMPERATURE, top_k=TOP_K, seed=seed, gamma=2,
                           drafter="diffusion", draft_passes=passes)
        x1, x2 = run(speculative.decode_speculative(models, prompt_ids, cfg))[0].tokens
        counts[x1, x2] += 1
    return counts


def test_diffusion_drafter_sampling_matches_exact_target_distribution(small_vocab_models):
    """Two passes over gamma = 2: the first token is drawn at pass 1, the second at pass 2 given the first."""
    joint = exact_two_token_distribution(small_vocab_models, [1, 2, 3])
    counts = sample_two_tokens(small_vocab_models, [1, 2, 3], passes=2)
    assert chi_square_p(counts, joint) > 1e-3


def test_negative_control_draft_not_drawn_from_its_q_fails(small_vocab_models, monkeypatch):
    """A drafter that draws from a sharper distribution than the q it reports is biased: the test must see it."""
    real = drafters.sample
    monkeypatch.setattr(drafters, "sample", lambda probs, gen: real(probs ** 4 / (probs ** 4).sum(), gen))
    joint = exact_two_token_distribution(small_vocab_models, [1, 2, 3])
    counts = sample_two_tokens(small_vocab_models, [1, 2, 3], 1)
    assert chi_square_p(counts, joint) < 1e-3


# ------------------------------------------------------------------------------------------
# the KV cache

def fed_per_forward(model, fn):
    """Run fn() and return the number of positions each forward pass of ``model`` was fed."""
    fed = []
    handle = model.register_forward_hook(lambda m, args, kwargs, out: fed.append(kwargs["input_ids"].shape[1]),
                                         with_kwargs=True)
    try:
        fn()
    finally:
        handle.remove()
    return fed


def test_cache_reuse_is_real(random_models):
    prompt = "def f(x):"
    p = len(random_models.tokenizer(prompt).input_ids)
    n, block, steps = 16, 4, 8  # 4 blocks, 2 passes each; logits shifted: a cached pass starts one early
    fed = {c: fed_per_forward(random_models.diffusion, lambda c=c: explorer.decode(
        "diffusion", random_models, prompt, max_new_tokens=n, steps=steps, block_length=block, cache=c))
        for c in ("none", "prefix", "dual", "delayed")}
    assert fed["none"] == [p + n] * steps
    assert fed["prefix"] == [x for b in range(4) for x in (p + n, n - b * block + 1)]
    assert fed["dual"] == [x for b in range(4) for x in (p + n, block + 1)]
    # delayed: one full pass; then a block's first pass refeeds the block just finished with it (and one before)
    assert fed["delayed"] == [p + n, block + 1] + [2 * block + 1, block + 1] * 3
    trace = explorer.decode("diffusion", random_models, prompt, max_new_tokens=n, steps=steps, block_length=block,
                            cache="dual")
    assert [e.fed_tokens for e in trace.events] == fed["dual"]
    # the drafter's prefix cache: after the first proposal a pass feeds only what is new + gamma masks
    drafts = fed_per_forward(random_models.diffusion, lambda: explorer.decode(
        "speculative", random_models, prompt, max_new_tokens=12, gamma=4, drafter="diffusion", cache="prefix"))
    assert drafts[0] == p + 4 and all(f <= 1 + 5 + 4 for f in drafts[1:])


CACHE_RUNS = [dict(max_new_tokens=16, steps=8, block_length=4),
              dict(max_new_tokens=24, steps=12, block_length=8, temperature=0.9, seed=4),
              dict(max_new_tokens=16, steps=16, threshold=0.3)]


@pytest.mark.parametrize("options", CACHE_RUNS)
def test_the_delayed_cache_on_a_one_layer_denoiser_gives_the_output_of_none(random_models, options):
    """One layer: every position's keys and values come from its own token alone, so a stored one is exact until its
    token changes. The delayed cache refeeds each block once it is finished; had it kept a block's keys and values
    from while it was masked, the next block would attend to masks there and the output would part from none's."""
    tok = random_models.tokenizer
    one = dataclasses.replace(random_models, diffusion=build_random_llama(len(tok), 64, 1, seed=3, is_causal=False,
                                                                         eos_id=tok.eos_token_id))
    ids = tok("import os\n").input_ids
    none = run(decode_diffusion(one, ids, DecodeConfig(cache="none", **options)))[0].tokens
    assert run(decode_diffusion(one, ids, DecodeConfig(cache="delayed", **options)))[0].tokens == none


@pytest.mark.parametrize("cache", ["prefix", "dual", "delayed"])
@pytest.mark.parametrize("options", CACHE_RUNS)
def test_cache_refreshed_every_step_gives_the_output_of_none(random_models, cache, options):
    ids = random_models.tokenizer("import os\n").input_ids
    none = run(decode_diffusion(random_models, ids, DecodeConfig(cache="none", **options)))[0].tokens
    fed = []
    handle = random_models.diffusion.register_forward_hook(
        lambda m, args, kwargs, out: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        refreshed = run(decode_diffusion(random_models, ids, DecodeConfig(cache=cache, **options),
                                         refresh_every_step=True))[0].tokens
    finally:
        handle.remove()
    assert refreshed == none
    assert fed[1::2] and all(f < len(ids) + options["max_new_tokens"] for f in fed[1::2])  # the cached passes


def test_bad_options_get_one_clear_error(random_models):
    with pytest.raises(ExplorerError, match="unknown cache 'nope'; choose one of none, prefix, dual"):
        explorer.decode("diffusion", random_models, "abc", cache="nope")
    with pytest.raises(ExplorerError, match="draft_passes must be a whole number >= 1"):
        explorer.decode("speculative", random_models, "abc", drafter="diffusion", draft_passes=0)
    other = build_byte_tokenizer()
    other.add_tokens(["<|other|>"])
    models = dataclasses.replace(random_models, diffusion_tokenizer=other)
    with pytest.raises(ExplorerError, match="diffusion model of preset 'random-tiny' uses another tokenizer"):
        explorer.decode("speculative", models, "abc", drafter="diffusion")
    no_diffusion = dataclasses.replace(random_models, diffusion=None)
    with pytest.raises(ExplorerError, match="has no diffusion model; the diffusion drafter needs one"):
        explorer.decode("speculative", no_diffusion, "abc", drafter="diffusion")


def test_cache_on_a_model_without_kv_cache_is_refused_and_defaults_to_none():
    from tests.test_diffusion import tiny_bert_models

    models = tiny_bert_models()
    with pytest.raises(ExplorerError, match="cache 'dual' needs a diffusion model that takes a KV cache"):
        explorer.decode("diffusion", models, "hello", max_new_tokens=8, cache="dual")
    assert explorer.decode("diffusion", models, "hello", max_new_tokens=8).stats["cache"] == "none"


def test_default_cache_and_adaptive_passes_in_the_stats(random_models):
    from explorer.app.render import lane_detail
    from explorer.decoding.config import DEFAULT_CACHE

    trace = explorer.decode("diffusion", random_models, "abc", max_new_tokens=16, steps=16, block_length=8,
                            threshold=0.05)
    s = trace.stats
    assert s["cache"] == DEFAULT_CACHE and s["steps"] == 16
    assert s["denoiser_passes"] == s["target_forward_passes"] == len(trace.events) < 16
    assert "at most K = 16 passes (adaptive)" in lane_detail("diffusion", trace.config)
