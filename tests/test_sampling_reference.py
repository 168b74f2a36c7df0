"""Warping, adaptive gamma and the audit's bug models against plain references."""

import itertools

import numpy as np
import pytest
import torch
from references import np_warp
from scipy import stats

from explorer.decoding.config import DecodeConfig
from explorer.decoding.sampling import warp_logits
from explorer.decoding.speculative import next_gamma, verify_drafts
from explorer.measure.audit_exact import Exact, first_step, joint_two, reference_warp


@pytest.mark.parametrize("temperature,top_k,top_p", itertools.product([0.0, 0.5, 1.0, 1.7], [None, 1, 3, 7],
                                                                     [None, 0.3, 0.9]))
def test_warp_matches_numpy_softmax_restricted_to_top_k_and_top_p(temperature, top_k, top_p):
    rng = np.random.default_rng(7)
    for _ in range(5):
        logits = rng.normal(0, 2, size=11)  # distinct values: no ties at the top-k boundary
        expected = np_warp(logits, temperature, top_k, top_p)
        got = warp_logits(torch.tensor(logits, dtype=torch.float32), temperature, top_k, top_p).double().numpy()
        np.testing.assert_allclose(got, expected, atol=1e-6)
        np.testing.assert_allclose(reference_warp(logits, temperature, top_k, top_p), expected, atol=1e-12)


def test_warp_literal_case():
    """T = 0.5 doubles the logits; top-2 keeps the two largest: p = softmax([2, 0]) there."""
    p = warp_logits(torch.tensor([1.0, 0.0, -1.0]), 0.5, top_k=2)
    e = np.exp(2.0)
    np.testing.assert_allclose(p.numpy(), [e / (e + 1), 1 / (e + 1), 0.0], atol=1e-6)


def test_next_gamma_plus_two_after_full_acceptance_minus_one_after_rejection():
    on = DecodeConfig(adaptive_gamma=True)
    assert [next_gamma(3, True, on), next_gamma(3, False, on), next_gamma(1, False, on)] == [5, 2, 1]
    assert next_gamma(15, True, on) == 16 and next_gamma(16, True, on) == 16
    off = DecodeConfig(adaptive_gamma=False)
    assert next_gamma(3, True, off) == 3 and next_gamma(3, False, off) == 3


def simulate_first_two(p1, q1, q1_raw, p2, bug, n, rng):
    """The speculative rule (one draft, then a bonus) run literally in numpy, with a bug switched on."""
    v = len(p1)
    out = np.zeros((v, v))
    drafts = rng.choice(v, size=n, p=q1)
    u = rng.random(n)
    q_verify = q1_raw if bug == "q_before_warping" else q1
    residual = np.clip(p1 - q_verify, 0, None)
    residual = p1 if bug == "no_residual" else residual / residual.sum()
    for d, ui in zip(drafts, u, strict=True):
        if ui < min(1.0, p1[d] / q_verify[d]):
            x1 = d
            x2 = rng.choice(v, p=q1 if bug == "bonus_from_draft" else p2[x1])
        else:
            x1 = rng.choice(v, p=residual)
            x2 = rng.choice(v, p=p2[x1])
        out[x1, x2] += 1
    return out / n


@pytest.mark.parametrize("bug", [None, "no_residual", "q_before_warping", "bonus_from_draft"])
def test_audit_bug_models_match_a_literal_simulation(bug):
    rng = np.random.default_rng(3)
    v = 4
    p1, q1_raw = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
    q1 = q1_raw ** 2 / (q1_raw ** 2).sum()  # "warped" (T = 0.5)
    p2 = rng.dirichlet(np.ones(v), size=v)
    e = Exact(p1, q1, q1_raw, np.arange(v), p2)
    exact = joint_two(e, bug)
    assert np.isclose(exact.sum(), 1) and np.allclose(exact.sum(1), first_step(e, bug)[0])
    simulated = simulate_first_two(p1, q1, q1_raw, p2, bug, 20_000, rng)
    assert 0.5 * np.abs(exact - simulated).sum() < 0.03
    if bug is None:
        assert np.allclose(exact, p1[:, None] * p2)
    else:
        assert 0.5 * np.abs(exact - p1[:, None] * p2).sum() > 0.05  # the bug moves it


@pytest.mark.parametrize("drafted_token", [0, 3])
def test_verify_drafts_emits_the_target_distribution(drafted_token):
    """One draft x ~ q, then the rule: the first emitted token ~ p1, and a bonus (after acceptance) ~ p2.

    Counted exactly over the draft (each x weighted by q(x)), sampled over the accept/residual coin."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.4, 0.3, 0.2, 0.1]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    gen = torch.Generator().manual_seed(drafted_token)
    n = 2000
    first, bonus = np.zeros(4), np.zeros(4)
    for _ in range(n):
        accepted, _, nxt, is_bonus = verify_drafts(p, q, [drafted_token], gen)
        if accepted:
            first[drafted_token] += 1
            bonus[nxt] += 1
            assert is_bonus
        else:
            first[nxt] += 1
    p1, q1, p2 = p[0].double().numpy(), q[0].double().numpy(), p[1].double().numpy()
    pq = np.minimum(p1, q1)
    accept = pq[drafted_token] / q1[drafted_token]
    residual = np.clip(p1 - q1, 0, None) / (1 - pq.sum())
    expected = np.eye(4)[drafted_token] * accept + (1 - accept) * residual
    assert first[expected == 0].sum() == 0
    if (expected > 0).sum() > 1:
        e = expected[expected > 0]
        assert stats.chisquare(first[expected > 0], e / e.sum() * n).pvalue > 1e-3
    if bonus.sum():
        assert stats.chisquare(bonus, p2 / p2.sum() * bonus.sum()).pvalue > 1e-3
