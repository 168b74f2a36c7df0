"""Exactness of speculative decoding against references, not against itself.

Greedy: token-for-token equal to our autoregressive decoder and to transformers' generate.
Sampling: the empirical distribution of the first two tokens matches the exact target
distribution computed by enumeration (chi-square), and a broken variant fails the same test.
Every drafter the registry names (config.DRAFTERS, and the families' own behind those names) is tested by
construction: the parameters are the registry, so a new drafter is tested the moment it is registered.
"""

import itertools
import types

import numpy as np
import pytest
import torch
from references import np_warp
from scipy import stats

import explorer
from explorer.decoding import acceptance, speculative
from explorer.decoding.config import DRAFTERS, TREE_DRAFTERS, DecodeConfig
from explorer.decoding.draft import Draft
from explorer.decoding.drafters import available_drafters
from explorer.decoding.events import Proposal
from explorer.families.random_tiny import build_random_llama
from explorer.runtime import Models, Preset

PROMPTS = ["def parse(line):", "import os\n", "x = [i * i for i", "class A:\n    def", "Hello, world",
           "for k, v in d.items():", "# TODO", "return None", "while True:\n", "print('hi')"]


def hf_greedy(models, prompt, n):
    ids = torch.tensor([models.tokenizer(prompt).input_ids])
    out = models.target.generate(ids, do_sample=False, max_new_tokens=n, eos_token_id=models.tokenizer.eos_token_id,
                                 pad_token_id=models.tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def test_the_random_bundle_runs_every_registered_drafter(random_models):
    assert available_drafters(random_models) == list(DRAFTERS), "a drafter the greedy tests below would skip"


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_speculative_equals_autoregressive_and_hf_generate(random_models, drafter):
    cases = [(p, seed) for p in PROMPTS for seed in (0, 1)]  # 20 prompt/seed cases
    accepted = rejected = 0
    for (prompt, seed), gamma in itertools.product(cases, [1, 2, 4, 8]):
        n = 10 + seed * 3
        ar = explorer.decode("autoregressive", random_models, prompt, max_new_tokens=n, seed=seed)
        spec = explorer.decode("speculative", random_models, prompt, max_new_tokens=n, seed=seed, gamma=gamma,
                               drafter=drafter, early_exit_layers=1)
        assert spec.token_ids == ar.token_ids, (prompt, seed, gamma)
        accepted += spec.stats["accepted"]
        rejected += spec.stats["proposed"] - spec.stats["accepted"]
    for prompt in PROMPTS:
        ar = explorer.decode("autoregressive", random_models, prompt, max_new_tokens=13)
        assert ar.token_ids == hf_greedy(random_models, prompt, 13)
    if drafter in ("model", "early_exit"):  # random text rarely repeats itself; a random denoiser or head agrees
        assert accepted > 0 and rejected > 0, "both the accept and the reject path must be exercised"  # by chance
    assert rejected > 0


def test_counting_and_kv_rollback(random_models):
    prompt = "def parse(line):"
    n_prompt = len(random_models.tokenizer(prompt).input_ids)
    for drafter, gamma in itertools.product(DRAFTERS, [1, 3, 6]):
        trace = explorer.decode("speculative", random_models, prompt, max_new_tokens=20, gamma=gamma,
                                drafter=drafter, early_exit_layers=1, temperature=0.8, seed=3)
        s = trace.stats
        assert 0 <= s["accepted"] <= s["proposed"]
        assert s["new_tokens"] / s["target_forward_passes"] >= 1
        emitted = 0
        for event in trace.events:
            if isinstance(event, explorer.decoding.events.Verification):
                emitted += len(event.emitted)
                # the target cache holds everything but the newest token
                assert event.target_cache_len == n_prompt + emitted - 1
                if event.draft_cache_len is not None:
                    assert event.draft_cache_len <= n_prompt + emitted - 1
                assert event.accepted == sum(c.accepted for c in event.checks)
        assert emitted == s["new_tokens"] == len(trace.token_ids)


def test_stops_at_eos_and_never_emits_after_it(random_models):
    eos = random_models.tokenizer.eos_token_id
    # Copies of target and draft that prefer EOS from absolute position 8 on (prompt "abc" is 3 tokens),
    # so the EOS lands inside a run of accepted drafts.
    models = Models(random_models.preset, random_models.tokenizer, _eos_after(random_models.target, eos, 8),
                    _eos_after(random_models.draft, eos, 8), None, random_models.tokenizer, random_models.device,
                    random_models.dtype)
    for method, gamma in [("autoregressive", 1), ("speculative", 4), ("speculative", 8)]:
        trace = explorer.decode(method, models, "abc", max_new_tokens=20, gamma=gamma)
        assert trace.token_ids[-1] == eos and eos not in trace.token_ids[:-1]
        assert len(trace.token_ids) == 6  # positions 3..8, EOS at absolute position 8


def _eos_after(model, eos, position):
    import copy

    clone = copy.deepcopy(model)

    def boost(module, args, kwargs, out):
        cache = kwargs.get("past_key_values")
        end = cache.get_seq_length() if cache is not None else out.logits.shape[1]
        first = end - out.logits.shape[1]  # absolute position of the first row
        for row in range(out.logits.shape[1]):
            if first + row + 1 >= position:  # row predicts absolute position first + row + 1
                out.logits[0, row, eos] = out.logits[0, row].max() + 10.0
        return out

    clone.register_forward_hook(boost, with_kwargs=True)
    return clone


# ------------------------------------------------------------------------------------------
# statistical exactness

VOCAB, TEMPERATURE, TOP_K, SAMPLES = 8, 0.7, 4, 3000


@pytest.fixture(scope="module")
def small_vocab_models():
    target = build_random_llama(VOCAB, 16, 2, seed=11, std=0.6).eval()  # 2 layers: an early exit after 1
    draft = build_random_llama(VOCAB, 16, 1, seed=12, std=0.6).eval()
    tokenizer = types.SimpleNamespace(eos_token_id=None)
    return Models(Preset("stat", "random", ""), tokenizer, target, draft, None, tokenizer, torch.device("cpu"),
                  torch.float32)


def exact_two_token_distribution(models, prompt_ids):
    """P(x1, x2) by enumeration, warped by the plain numpy reference (not the product's warp_logits)."""
    def target(ids):
        with torch.inference_mode():
            return np_warp(models.target(torch.tensor([ids])).logits[0, -1].double().numpy(), TEMPERATURE, TOP_K)

    p1 = target(prompt_ids)
    joint = np.array([p1[x1] * target(prompt_ids + [x1]) for x1 in range(VOCAB)])
    return joint / joint.sum()


def sample_two_tokens(models, prompt_ids, vocab=VOCAB, samples=SAMPLES, temperature=TEMPERATURE, top_k=TOP_K,
                      lengths=None, new_tokens=2, **options):
    """Counts (vocab, vocab) of the first two tokens of ``samples`` seeded speculative decodes (``options``: more
    DecodeConfig fields; ``lengths``: a list that collects the first proposal's length of each; with ``new_tokens``
    = 2 the first draft is one token, with 3 it may be two)."""
    counts = np.zeros((vocab, vocab))
    for seed in range(samples):
        cfg = DecodeConfig(max_new_tokens=new_tokens, temperature=temperature, top_k=top_k, seed=seed, gamma=2,
                           **options)
        gen = speculative.decode_speculative(models, prompt_ids, cfg)
        first = None
        try:
            while True:
                event = next(gen)
                if first is None and isinstance(event, Proposal):
                    first = len(event.tokens)
        except StopIteration as stop:
            x1, x2 = stop.value.tokens[:2]
        counts[x1, x2] += 1
        if lengths is not None:
            lengths.append(first)
    return counts


def chi_square_p(counts, joint):
    support = joint > 0
    assert counts[~support].sum() == 0, "sampled a token outside the warped support"
    expected = joint[support] * counts.sum()
    # pool cells with small expected counts so the chi-square approximation holds
    small = expected < 5
    obs = np.append(counts[support][~small], counts[support][small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


# a prompt whose last two tokens came earlier: the lookup drafters (prompt lookup) propose on it too
LOOKUP_PROMPT = [1, 2, 3, 1, 2]


def drafter_counts(models, drafter):
    """Two-token counts of ``drafter`` on LOOKUP_PROMPT, after checking that it proposed on most decodes (else a
    chi-square would test the target alone)."""
    lengths = []
    counts = sample_two_tokens(models, LOOKUP_PROMPT, lengths=lengths, drafter=drafter, early_exit_layers=1)
    assert sum(bool(n) for n in lengths) > len(lengths) / 2, f"the {drafter} drafter proposed on too few decodes"
    return counts


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_speculative_sampling_matches_exact_target_distribution(small_vocab_models, drafter):
    if drafter not in available_drafters(small_vocab_models):
        pytest.skip(f"the 8-token bundle has no {drafter} drafter (its greedy equality runs above)")
    joint = exact_two_token_distribution(small_vocab_models, LOOKUP_PROMPT)
    assert chi_square_p(drafter_counts(small_vocab_models, drafter), joint) > 1e-3


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_negative_control_a_drafter_that_reports_uniform_q_fails(small_vocab_models, monkeypatch, drafter):
    """A drafter whose q is not the distribution its tokens came from breaks exactness; greedy equality cannot see
    it, the chi-square must, for every registered drafter."""
    if drafter not in available_drafters(small_vocab_models):
        pytest.skip(f"the 8-token bundle has no {drafter} drafter")
    real = speculative.make_drafter

    def lying(models, cfg):
        drafter = real(models, cfg)
        propose = drafter.propose

        def uniform(tokens, gamma, cfg, gen):
            d = propose(tokens, gamma, cfg, gen)
            return Draft(d.tokens, None if d.q is None else torch.full_like(d.q, 1 / d.q.shape[-1]), d.forward_s,
                         d.passes)
        drafter.propose = uniform
        return drafter

    monkeypatch.setattr(speculative, "make_drafter", lying)
    joint = exact_two_token_distribution(small_vocab_models, LOOKUP_PROMPT)
    assert chi_square_p(drafter_counts(small_vocab_models, drafter), joint) < 1e-3


def test_negative_control_without_residual_distribution_fails(small_vocab_models, monkeypatch):
    """Sampling from p instead of norm(max(0, p - q)) after a rejection is biased: the test must see it."""
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q: p)
    prompt_ids = [1, 2, 3]
    joint = exact_two_token_distribution(small_vocab_models, prompt_ids)
    counts = sample_two_tokens(small_vocab_models, prompt_ids)
    assert chi_square_p(counts, joint) < 1e-3


def test_a_draft_cut_by_the_drafters_confidence_keeps_sampling_exact(small_vocab_models):
    """``draft_confidence`` ends a draft once its probability under the draft falls below it: a rule on the draft's
    own output, so the tokens are still the target's. Both paths are exercised: drafts of 1 (cut) and of 2."""
    prompt_ids, lengths = [1, 2, 3], []
    joint = exact_two_token_distribution(small_vocab_models, prompt_ids)
    counts = sample_two_tokens(small_vocab_models, prompt_ids, lengths=lengths, new_tokens=3,
                               draft_confidence=0.3)
    assert 0.2 < lengths.count(1) / len(lengths) < 0.8, "the cut must happen on some drafts and not on others"
    assert chi_square_p(counts, joint) > 1e-3


@pytest.mark.parametrize("drafter", TREE_DRAFTERS)
def test_greedy_speculative_with_a_confidence_cut_equals_autoregressive(random_models, drafter):
    cut = False
    for prompt in PROMPTS[:4]:
        ar = explorer.decode("autoregressive", random_models, prompt, max_new_tokens=24)
        spec = explorer.decode("speculative", random_models, prompt, max_new_tokens=24, gamma=6, drafter=drafter,
                               draft_confidence=0.3)
        assert spec.token_ids == ar.token_ids
        cut |= any(len(e.tokens) < 6 for e in spec.events if isinstance(e, Proposal) and e.tokens)
    assert cut, "no draft was ever cut"


def test_the_presets_draft_confidence_applies_only_to_its_own_chain(random_models):
    """A decode that names neither γ nor draft_confidence drafts the preset's way; naming γ asks for that chain."""
    from dataclasses import replace

    from explorer.decoding.api import make_config

    models = replace(random_models, preset=replace(random_models.preset, draft_confidence=0.4))
    assert make_config("speculative", models, {}).draft_confidence == 0.4
    assert make_config("speculative", models, {"gamma": 3}).draft_confidence is None
    assert make_config("speculative", models, {"draft_confidence": None}).draft_confidence is None
    assert make_config("speculative", models, {"draft_confidence": 0.2}).draft_confidence == 0.2
    assert make_config("speculative", models, {"tree": "2,1"}).draft_confidence is None
    other = "early_exit" if models.preset.drafter != "early_exit" else "model"
    assert make_config("speculative", models, {"drafter": other}).draft_confidence is None


def test_adaptive_gamma_keeps_greedy_output_and_changes_gamma(random_models):
    changed = False
    for prompt in PROMPTS[:5]:
        ar = explorer.decode("autoregressive", random_models, prompt, max_new_tokens=24)
        spec = explorer.decode("speculative", random_models, prompt, max_new_tokens=24, gamma=3, adaptive_gamma=True)
        assert spec.token_ids == ar.token_ids
        gammas = [e.gamma for e in spec.events if isinstance(e, explorer.decoding.events.Proposal)]
        changed |= len(set(gammas)) > 1
    assert changed, "adaptive gamma never moved"


@pytest.mark.parametrize("tree", [None, "2,1"])
def test_a_drafter_hears_which_of_its_tokens_were_kept(random_models, monkeypatch, tree):
    """The Drafter protocol's observe(drafted, accepted, kept) after each verification: the kept tokens, step by step,
    are the decode's output, and the accepted count matches the Verification events."""
    from explorer.decoding import speculative, speculative_tree
    from explorer.decoding.events import Verification

    heard = []
    module, factory = (speculative_tree, "make_tree_drafter") if tree else (speculative, "make_drafter")
    real = getattr(module, factory)

    def recording(*args, **kwargs):
        drafter = real(*args, **kwargs)
        drafter.observe = lambda drafted, accepted, kept: heard.append((list(drafted), accepted, kept))
        return drafter

    monkeypatch.setattr(module, factory, recording)
    trace = explorer.decode("speculative", random_models, "abc", max_new_tokens=12, gamma=3, temperature=1.0,
                            seed=3, drafter="model", tree=tree)
    steps = [e for e in trace.events if isinstance(e, Verification)]
    assert len(heard) == len(steps) > 0
    assert [t for _, _, kept in heard for t in kept] == trace.token_ids
    assert [a for _, a, _ in heard] == [v.accepted for v in steps]
    assert all(kept[:a] == drafted[:a] for drafted, a, kept in heard)
