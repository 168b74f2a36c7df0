"""Losslessness audit: does speculative sampling reproduce the target's distribution, and could we tell?

Samples one prompt many times with the autoregressive and the speculative decoder (different seeds).

* **Exact tests (one-sample chi-square goodness of fit).** The first new token's distribution is
  computed exactly: the target's logits warped by a plain numpy softmax(logits / T) restricted to the
  top k / top p (``reference_warp``, independent of ``sampling.warp_logits``). When the first token
  can be enumerated (at most ``ENUMERATE_MAX`` tokens in the support of p or q), the exact joint of
  the first two tokens is tested too. The speculative samples are tested against them, and the
  autoregressive samples as a control of the reference itself.
* **Two-sample test** of the full compared prefix (AR against speculative), over well-filled cells.
* **Cell rule** (every chi-square here): an outcome is its own cell when its expected count is >= 5
  (two-sample: when both samples together hold >= 10); the rest is pooled into one cell, and that cell,
  if its expected count is < 5, is merged into the smallest kept cell. An outcome the target cannot
  produce (probability 0) that is sampled fails the test outright (p = 0).
* **Power.** The known bugs are computed exactly here, from p and q at the first position (and at the
  second when the first step drafts one token): no residual (resample from p after a rejection); q
  taken before warping (drawn from the warped q, verified with softmax of the raw draft logits); the
  bonus token drawn from the draft (its last row) instead of the target. Dropping the bonus does not
  change the distribution (the next step samples the same p), so it is no distribution bug. For each
  bug: its TV from the exact distribution, the probability the tests detect it at this sample size
  (non-central chi-square), and the samples needed for ``POWER``. The smallest TV detected with
  probability ``POWER`` whatever its shape is sqrt(lambda* / n) / 2 (chi-square w >= 2 TV).
* **Verdict.** FAIL when a test rejects at alpha / m (Bonferroni over the m tests); otherwise PASS only
  if at least one known bug moves the compared outcomes by TV >= ``TV_FLOOR`` and every such bug would
  have been detected with probability >= ``POWER``; otherwise INCONCLUSIVE: with the sample count that
  would suffice, or "vacuous at these settings" when no known bug changes the output here (greedy
  decoding: a PASS would have tested nothing).
  ``until_detectable`` raises the sample count to that number (up to ``max_samples``) before sampling,
  so the sample size never depends on the data.

The exact distributions live in ``audit_exact``, the statistics in ``audit_stats``; this module plans,
samples and judges.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from explorer.decoding.api import decode, make_config
from explorer.measure.audit_exact import Exact, exact_distributions, first_step, joint_two
from explorer.measure.audit_stats import (
    MAX_SAMPLES,
    POWER,
    bootstrap_tv,
    chi2_homogeneity,
    detection_power,
    gof_p_value,
    min_detectable_tv,
    permutation_null,
    samples_needed,
    total_variation,
    tv,
)
from explorer.runtime import Models

TV_FLOOR = 0.01  # a bug moving the compared outcomes by less than this is not required to be detectable
MIN_SAMPLES = 50  # the automatic sample count never goes below this
BUGS = {
    "no_residual": "after a rejection, resample from p instead of norm(max(0, p - q))",
    "q_before_warping": "draft drawn from the warped q but verified with softmax of the raw draft logits",
    "bonus_from_draft": "bonus token drawn from the draft's last distribution instead of the target's",
}


@dataclass
class AuditResult:
    samples: int
    prefix_tokens: int
    status: str  # PASS | FAIL | INCONCLUSIVE
    verdict: str
    tests: list[dict]  # name, p_value, cells, alpha (each at alpha / m)
    bugs: list[dict]  # name, description, tv_here, power, samples_needed, counted
    min_detectable_tv: float  # smallest TV (first token, any shape) detected with probability POWER
    samples_needed: int | None  # for every counted bug to be detectable (None: not reachable by MAX_SAMPLES)
    exact_first_p_value: float
    exact_joint_p_value: float | None  # None: the first token's outcomes were too many to enumerate
    first_token_tv_exact_spec: float
    acceptance_rate: float
    notes: list[str] = field(default_factory=list)
    # the autoregressive control (None when not sampled: the exact tests cover every compared token)
    chi2_p_value: float | None = None  # two-sample, well-filled cells
    tv_distance: float | None = None
    tv_ci95: tuple[float, float] | None = None
    tv_null_range: tuple[float, float] | None = None  # 95% range of TV between same-size samples of one law
    permutation_p_value: float | None = None
    first_token_tv_exact_ar: float | None = None

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def report_lines(result: AuditResult) -> list[str]:
    """The audit in words, the same for the CLI and the app: counts, each test, power, each known bug, verdict."""
    lines = [f"samples: {result.samples}, compared: first {result.prefix_tokens} new tokens; "
             f"draft acceptance {result.acceptance_rate:.3f}"]
    lines += [f"  {t['name']}: p = {t['p_value']:.4g} (rejects below {t['alpha']:.2g})" for t in result.tests]
    lines.append(f"first token vs the exact target distribution: TV speculative {result.first_token_tv_exact_spec:.4f}"
                 + ("" if result.first_token_tv_exact_ar is None else f", AR {result.first_token_tv_exact_ar:.4f}"))
    lines.append(f"smallest first-token TV detected with probability {POWER} at {result.samples} samples: "
                 f"{result.min_detectable_tv:.3f}")
    for b in result.bugs:
        need = b["samples_needed"] if b["samples_needed"] is not None else "-"
        lines.append(f"  known bug {b['name']}: TV here {b['tv_here']:.3f}, detected with probability "
                     f"{b['power']:.2f}, samples for {POWER}: {need}"
                     + ("" if b["counted"] else " (not counted: TV < 0.01 here)"))
    lines += [f"note: {note}" for note in result.notes]
    lines.append(result.verdict)
    return lines


def headline(result: AuditResult) -> str:
    """The verdict's first words: the status, and why when a PASS would have tested nothing."""
    if "vacuous" in result.verdict:
        return result.verdict.split(")")[0] + ")"
    return result.status


# ------------------------------------------------------------------------------ the audit

@dataclass
class _Plan:
    """What the exact tests and the bug alternatives are, before any sample is drawn."""

    exact: Exact
    joint: bool  # the exact joint of two tokens is tested
    bug_joint: bool  # the bug alternatives at position 2 are known (the first step drafts one token)
    control: bool  # also sample the autoregressive decoder (control + two-sample test)

    @property
    def m(self) -> int:
        """Number of tests (Bonferroni): exact first token, exact joint, AR control, two-sample."""
        return 1 + self.joint + 2 * self.control

    def nulls(self) -> list[tuple[str, np.ndarray]]:
        out = [("first token", self.exact.p1)]
        if self.joint:
            out.append(("first two tokens", joint_two(self.exact, None).ravel()))
        return out

    def alternatives(self, bug: str) -> list[np.ndarray]:
        out = [first_step(self.exact, bug)[0]]
        if self.joint:
            out.append(joint_two(self.exact, bug).ravel() if self.bug_joint else None)
        return out


def _bug_table(plan: _Plan, n: int, alpha: float) -> list[dict]:
    rows = []
    for name, description in BUGS.items():
        powers, needed, tvs = [], [], []
        for (_, null), alt in zip(plan.nulls(), plan.alternatives(name), strict=True):
            if alt is None:
                continue
            tvs.append(tv(null, alt))
            powers.append(detection_power(null, alt, n, alpha / plan.m))
            needed.append(samples_needed(null, alt, alpha / plan.m) if tvs[-1] >= TV_FLOOR else None)
        reachable = [x for x in needed if x is not None]
        rows.append({"name": name, "description": description, "tv_here": max(tvs), "power": max(powers),
                     "samples_needed": min(reachable) if reachable else None, "counted": max(tvs) >= TV_FLOOR})
    return rows


def plan_audit(models: Models, prompt: str, prefix_tokens: int, control: bool | None = None, **options) -> _Plan:
    """Exact distributions and bug alternatives; the AR control is sampled when asked, or when the exact
    tests do not cover every compared token."""
    cfg = make_config("speculative", models, dict(options))
    exact = exact_distributions(models, prompt, cfg)
    joint = prefix_tokens >= 2 and exact.first is not None
    decoded = decoded_tokens(exact, prefix_tokens)
    bug_joint = joint and min(cfg.gamma, decoded - 1 - exact.drafts_second) == 1
    covered = prefix_tokens == 1 or (prefix_tokens == 2 and joint)
    return _Plan(exact, joint, bug_joint, control=(not covered) if control is None else control)


def decoded_tokens(exact: Exact, prefix_tokens: int) -> int:
    """Tokens each sample decodes: at least two, so the first step drafts and verifies a token; three for a
    drafter that drafts after the prefill (its first draft is token 2, verified in the second step)."""
    return max(3 if exact.drafts_second else 2, prefix_tokens)


def samples_for_detection(plan: _Plan, alpha: float = 0.01) -> int | None:
    """Samples at which every known bug that matters here is detected with probability POWER (None: beyond
    MAX_SAMPLES)."""
    needed = [b["samples_needed"] for b in _bug_table(plan, MIN_SAMPLES, alpha) if b["counted"]]
    return None if None in needed else max(needed, default=MIN_SAMPLES)


def run_audit(models: Models, prompt: str, samples: int | None = None, prefix_tokens: int = 2,
              temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, seed: int = 0,
              alpha: float = 0.01, until_detectable: bool = False, max_samples: int = MAX_SAMPLES,
              control: bool | None = None, progress=None, **options) -> AuditResult:
    """``samples=None`` (the default): as many as make every known bug detectable here (at least
    MIN_SAMPLES, at most ``max_samples``); ``until_detectable`` raises a given count to that number."""
    options.update(temperature=temperature, top_k=top_k, top_p=top_p)
    plan = plan_audit(models, prompt, prefix_tokens, control, **options)
    notes = []
    if options.get("tree"):  # the exact tests hold for any sampler; the bug table models chains
        notes.append(f"tree {options['tree']}: the exact tests check the tree's output; the known-bug powers are "
                     "computed for a chain of the same drafter")
    if samples is None or until_detectable:
        needed = samples_for_detection(plan, alpha)
        target = max(samples or MIN_SAMPLES, needed if needed is not None else max_samples + 1)
        if target > max_samples:
            notes.append(f"detecting every known bug needs {needed or f'over {MAX_SAMPLES}'} samples; "
                         f"capped at {max_samples}")
        samples = min(target, max_samples)
    decoded = decoded_tokens(plan.exact, prefix_tokens)
    ar, spec, accepted, proposed = [], [], 0, 0
    for i in range(samples):
        if plan.control:
            a = decode("autoregressive", models, prompt, max_new_tokens=decoded, seed=seed + 2 * i, **options)
            ar.append(tuple(a.token_ids[:prefix_tokens]))
        s = decode("speculative", models, prompt, max_new_tokens=decoded, seed=seed + 2 * i + 1, **options)
        spec.append(tuple(s.token_ids[:prefix_tokens]))
        accepted += s.stats["accepted"]
        proposed += s.stats["proposed"]
        if progress:
            progress(i + 1, samples)
    return _judge(plan, ar, spec, samples, prefix_tokens, alpha, accepted / proposed if proposed else float("nan"),
                  notes, greedy=not temperature)


def _outcomes(seqs: list[tuple], e: Exact, two: bool) -> np.ndarray:
    """Sampled prefixes as indices into the exact distribution (first token, or (S, V) flattened)."""
    vocab = len(e.p1)
    if not two:
        return np.array([s[0] for s in seqs])
    where = {int(x): i for i, x in enumerate(e.first)}
    # a first token outside the enumerated support cannot be produced: map it to a zero-probability cell
    return np.array([where[s[0]] * vocab + s[min(1, len(s) - 1)] if s[0] in where else -1 for s in seqs])


def _judge(plan: _Plan, ar: list[tuple], spec: list[tuple], n: int, prefix_tokens: int, alpha: float,
           acceptance: float, notes: list[str], greedy: bool = False) -> AuditResult:
    e, level = plan.exact, alpha / plan.m
    tests = []
    exact_p = {}
    for label, null in plan.nulls():
        two = label != "first token"
        for who, seqs in (("speculative", spec), ("autoregressive (control)", ar)):
            if who != "speculative" and (two or not plan.control):
                continue
            idx = _outcomes(seqs, e, two)
            p_value, k = (0.0, 0) if (idx < 0).any() else gof_p_value(null, idx)
            tests.append({"name": f"{who} {label} vs exact", "p_value": p_value, "cells": k, "alpha": level})
            if who == "speculative":
                exact_p[label] = p_value
    ca, cs = Counter(ar), Counter(spec)
    chi2_p = chi2_homogeneity(ca, cs) if plan.control else None
    if plan.control:
        tests.append({"name": f"two-sample AR vs speculative, first {prefix_tokens} tokens", "p_value": chi2_p,
                      "cells": None, "alpha": level})
    bugs = _bug_table(plan, n, alpha)
    counted = [b for b in bugs if b["counted"]]
    needed = [b["samples_needed"] for b in counted]
    need = None if None in needed else max(needed, default=n)
    mdt = min_detectable_tv(e.p1, n, level)
    failed = [t for t in tests if t["p_value"] < level]
    weak = [b for b in counted if b["power"] < POWER]
    bug_text = "; ".join(f"{b['name']} TV {b['tv_here']:.3f} (power {b['power']:.2f})" for b in counted)
    blind = [b["name"] for b in bugs if not b["counted"]]
    blind_text = f" Not counted (TV < {TV_FLOOR} on the compared tokens here): {', '.join(blind)}." if blind else ""
    if failed:
        status = "FAIL"
        verdict = ("FAIL: the sampled distribution differs from the target's: " + "; ".join(
            f"{t['name']} p = {t['p_value']:.2g}" for t in failed) + f" (each test at {level:.2g}). "
            "Speculative sampling is not lossless here.")
    elif not counted:  # nothing here would have caught any known bug: a PASS would be vacuous
        status = "INCONCLUSIVE"
        verdict = "INCONCLUSIVE: vacuous at these settings " + (
            "(greedy: no known bug changes the output; try T > 0)." if greedy else
            f"(no known bug moves the compared tokens by TV >= {TV_FLOOR} here; try a higher temperature, a "
            "larger top-k or another prompt).") + f" No test rejects at {level:.2g}.{blind_text}"
    elif weak:
        status = "INCONCLUSIVE"
        more = f"about {need} samples would suffice" if need else f"more than {MAX_SAMPLES} samples would be needed"
        missed = "; ".join(f"{b['name']} TV {b['tv_here']:.3f} detected with probability {b['power']:.2f}"
                           for b in weak)
        verdict = (f"INCONCLUSIVE: no test rejects, but at {n} samples the audit could miss known bugs: {missed}; "
                   f"{more} (power {POWER}).{blind_text}")
    else:
        status = "PASS"
        lowest = min(t["p_value"] for t in tests)
        verdict = (f"PASS: no test rejects at {level:.2g} (lowest p = {lowest:.3f}), and each known bug would have "
                   f"been detected with probability >= {POWER}: {bug_text or 'none moves the output here'}. "
                   f"Any change of the first token by TV >= {mdt:.3f} would be too.{blind_text}")
    spec_first = np.bincount([s[0] for s in spec], minlength=len(e.p1)) / len(spec)
    two_sample = {}
    if plan.control:
        null = permutation_null(ar, spec)
        tv_ar_spec = total_variation(ca, cs)
        ar_first = np.bincount([s[0] for s in ar], minlength=len(e.p1)) / len(ar)
        two_sample = dict(tv_distance=tv_ar_spec, tv_ci95=bootstrap_tv(ar, spec),
                          tv_null_range=(float(np.percentile(null, 2.5)), float(np.percentile(null, 97.5))),
                          permutation_p_value=float((1 + (null >= tv_ar_spec).sum()) / (1 + len(null))),
                          first_token_tv_exact_ar=tv(e.p1, ar_first))
    return AuditResult(
        samples=n, prefix_tokens=prefix_tokens, status=status, verdict=verdict, tests=tests, bugs=bugs,
        min_detectable_tv=mdt, samples_needed=need, chi2_p_value=chi2_p, exact_first_p_value=exact_p["first token"],
        exact_joint_p_value=exact_p.get("first two tokens"), first_token_tv_exact_spec=tv(e.p1, spec_first),
        acceptance_rate=acceptance, notes=notes, **two_sample)
