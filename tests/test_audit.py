"""The losslessness audit has teeth: on `tiny` it passes the real sampler, fails each known bug at its
default sample count, and says INCONCLUSIVE (with the count that would suffice) when samples are too few."""

import re

import numpy as np
import pytest
from audit_bugs import INJECT
from scipy import stats

import explorer
from explorer.families.tiny import TINY_DIR
from explorer.measure import audit, audit_exact, audit_stats

pytestmark = pytest.mark.skipif(not (TINY_DIR / "target" / "config.json").exists(),
                                reason="assets/models/tiny not built")
PROMPT, OPTIONS = "import os\n", dict(temperature=1.0, top_k=2, gamma=3)  # seeded; ~70 samples suffice here


@pytest.fixture(scope="module")
def tiny():
    return explorer.load_models("tiny", device="cpu")


def test_real_sampler_passes_at_the_default_sample_count(tiny):
    result = audit.run_audit(tiny, PROMPT, **OPTIONS)
    assert result.status == "PASS" and result.verdict.startswith("PASS"), result.verdict
    assert result.samples == max(audit.MIN_SAMPLES, result.samples_needed)
    counted = [b for b in result.bugs if b["counted"]]
    assert {b["name"] for b in counted} == set(audit.BUGS) and all(b["power"] >= audit_stats.POWER for b in counted)
    assert result.exact_joint_p_value is not None and result.chi2_p_value is None  # the exact tests cover both


def test_the_audit_passes_at_an_exact_precision():
    """The default preset runs int8 on row-invariant kernels that take one sequence a pass; the audit's exact
    distributions are computed that way too (a batched pass there raised "batch 1 only")."""
    models = explorer.load_models("tiny", device="cpu", precision="int8")
    result = audit.run_audit(models, PROMPT, **OPTIONS)
    assert result.status == "PASS" and result.verdict.startswith("PASS"), result.verdict


@pytest.mark.parametrize("bug", list(INJECT))
def test_each_known_bug_fails_at_the_default_sample_count(tiny, monkeypatch, bug):
    INJECT[bug](monkeypatch)
    result = audit.run_audit(tiny, PROMPT, **OPTIONS)
    assert result.status == "FAIL" and result.verdict.startswith("FAIL"), result.verdict


def test_greedy_audit_is_vacuous_never_pass(tiny, capsys):
    """At T = 0 no known bug changes the output: the audit can test nothing, so it must not say PASS (and the
    CLI's --json exits 3, INCONCLUSIVE)."""
    result = audit.run_audit(tiny, PROMPT, temperature=0.0, top_k=2, gamma=3, samples=20)
    assert result.status == "INCONCLUSIVE", result.verdict
    assert result.verdict.startswith("INCONCLUSIVE: vacuous at these settings (greedy: no known bug changes the "
                                     "output; try T > 0).")
    assert audit.headline(result) == ("INCONCLUSIVE: vacuous at these settings (greedy: no known bug changes the "
                                      "output; try T > 0)")
    from explorer import cli

    code = cli.main(["audit", "--preset", "tiny", "--prompt", PROMPT, "--temperature", "0", "--top-k", "2",
                     "--samples", "10", "--json"])
    assert code == 3 and '"status": "INCONCLUSIVE"' in capsys.readouterr().out


def test_too_few_samples_is_inconclusive_never_pass(tiny):
    result = audit.run_audit(tiny, PROMPT, samples=30, **OPTIONS)
    assert result.status == "INCONCLUSIVE"
    needed = int(re.search(r"about (\d+) samples would suffice", result.verdict).group(1))
    assert needed == result.samples_needed > 30


def test_until_detectable_raises_the_count_and_caps_it(tiny):
    plan = audit.plan_audit(tiny, PROMPT, 2, **OPTIONS)
    assert audit.samples_for_detection(plan) > 30
    result = audit.run_audit(tiny, PROMPT, samples=20, until_detectable=True, max_samples=25, **OPTIONS)
    assert result.samples == 25 and result.status == "INCONCLUSIVE" and "capped at 25" in result.notes[0]


def test_bug_tv_here_is_exact(tiny):
    """The no-residual bug's TV at the first token, recomputed by hand from p and q."""
    plan = audit.plan_audit(tiny, PROMPT, 2, **OPTIONS)
    p, q = plan.exact.p1, plan.exact.q1
    overlap = np.minimum(p, q)
    broken = overlap + (1 - overlap.sum()) * p
    row = next(b for b in audit._bug_table(plan, 100, 0.01) if b["name"] == "no_residual")
    assert row["tv_here"] >= 0.5 * np.abs(broken - p).sum() - 1e-12 > 0.05


def test_power_and_minimum_detectable_tv_are_calibrated():
    """Simulated rejection rate of the goodness-of-fit test matches the non-central chi-square power."""
    rng = np.random.default_rng(0)
    null = np.array([0.4, 0.3, 0.2, 0.1])
    alt = np.array([0.3, 0.3, 0.25, 0.15])
    n, alpha = 150, 0.01
    predicted = audit_stats.detection_power(null, alt, n, alpha)
    rejected = np.mean([audit_stats.gof_p_value(null, rng.choice(4, n, p=alt))[0] < alpha for _ in range(400)])
    assert abs(rejected - predicted) < 0.08 and 0.2 < predicted < 0.95
    assert audit_stats.detection_power(null, null, n, alpha) == pytest.approx(alpha)
    d = audit_stats.min_detectable_tv(null, n, alpha)  # any alternative this far away is detected with 90%
    worst = null + d * np.array([1, -1, 0, 0])  # TV d, the shape that gives the least chi-square
    assert audit_stats.detection_power(null, worst, n, alpha) >= audit_stats.POWER - 1e-6


def test_cells_rule_and_impossible_outcomes():
    cell, k = audit_stats.cells(np.array([0.5, 0.46, 0.02, 0.02, 0.0]), 100)
    assert k == 2 and cell.tolist() == [0, 1, 1, 1, -1]  # the rest expects 4 < 5: merged into the smallest cell
    cell, k = audit_stats.cells(np.array([0.5, 0.45, 0.03, 0.02]), 100)
    assert k == 3 and cell.tolist() == [0, 1, 2, 2]  # the rest expects 5: a cell of its own
    assert audit_stats.gof_p_value(np.array([0.5, 0.5, 0.0]), np.array([0, 1, 2] * 10))[0] == 0.0
    p_value, _ = audit_stats.gof_p_value(np.array([0.5, 0.5]), np.array([0] * 60 + [1] * 40))
    assert p_value == pytest.approx(stats.chisquare([60, 40], [50, 50]).pvalue)


# ------------------------------------------------------------------------------------------
# a drafter that drafts after the prefill (the EAGLE head): its first draft is token 2

ASSISTANT = dict(drafter="assistant", gamma=3, temperature=1.0, top_k=3)


@pytest.fixture(scope="module")
def mini():
    return explorer.load_models("random-tiny", device="cpu")


def test_the_audit_models_a_second_step_drafter(mini):
    """The exact joint is unchanged (still the target's), the bugs now move it (they were invisible when
    the audit assumed the first step drafts), and the sampled drafts are really verified."""
    plan = audit.plan_audit(mini, "import os\n", 2, **ASSISTANT)
    assert plan.exact.drafts_second and plan.bug_joint and not plan.exact.q1.any()
    null = audit_exact.joint_two(plan.exact, None)
    np.testing.assert_allclose(null, plan.exact.p1[plan.exact.first][:, None] * plan.exact.p2, atol=1e-9)
    tvs = {b["name"]: b["tv_here"] for b in audit._bug_table(plan, 100, 0.01)}
    assert tvs["no_residual"] > 0.02 and tvs["q_before_warping"] > 0.04
    result = audit.run_audit(mini, "import os\n", samples=200, **ASSISTANT)
    assert result.status != "FAIL" and result.acceptance_rate > 0, result.verdict


def test_a_known_bug_fails_with_a_second_step_drafter(mini, monkeypatch):
    plan = audit.plan_audit(mini, "import os\n", 2, **ASSISTANT)
    needed = {b["name"]: b["samples_needed"] for b in audit._bug_table(plan, 100, 0.01)}["q_before_warping"]
    INJECT["q_before_warping"](monkeypatch)
    result = audit.run_audit(mini, "import os\n", samples=needed, **ASSISTANT)
    assert result.status == "FAIL", result.verdict
