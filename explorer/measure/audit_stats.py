"""The statistics of the audit: the cell rule, chi-square goodness of fit and homogeneity, the power of a test
against a given alternative, the samples it needs, the smallest TV it detects, and TV estimates."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from scipy import optimize
from scipy import stats as sps

# ------------------------------------------------------------------------------ tests and power

def cells(probs: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """Cell id per outcome by the module's rule (-1: impossible outcome) and the number of cells."""
    cell = np.full(probs.shape, -1, dtype=np.int64)
    keep = probs * n >= MIN_EXPECTED
    k = int(keep.sum())
    cell[keep] = np.arange(k)
    rest = (probs > 0) & ~keep
    if rest.any():
        if probs[rest].sum() * n >= MIN_EXPECTED or k == 0:
            cell[rest], k = k, k + 1
        else:
            kept = np.flatnonzero(keep)
            cell[rest] = cell[kept[np.argmin(probs[kept])]]
    return cell, k

POWER = 0.99  # a PASS means each known bug would have been caught 99 times in 100
MIN_EXPECTED = 5.0  # the cell rule: an outcome is its own cell when its expected count reaches this
MAX_SAMPLES = 20_000


def gof_p_value(probs: np.ndarray, outcomes: np.ndarray) -> tuple[float, int]:
    """One-sample chi-square of observed outcome indices against exact probabilities."""
    n = len(outcomes)
    cell, k = cells(probs, n)
    if (cell[outcomes] < 0).any():
        return 0.0, k  # sampled something the target cannot produce
    if k < 2:
        return 1.0, k
    observed = np.bincount(cell[outcomes], minlength=k)
    expected = np.bincount(cell[cell >= 0], probs[cell >= 0], minlength=k) * n
    return float(sps.chisquare(observed, expected).pvalue), k


def detection_power(null: np.ndarray, alt: np.ndarray, n: int, alpha: float) -> float:
    """Probability the goodness-of-fit test at level alpha rejects when samples come from ``alt``."""
    cell, k = cells(null, n)
    outside = float(alt[cell < 0].sum())
    chi_power = 0.0
    if k >= 2:
        pc = np.bincount(cell[cell >= 0], null[cell >= 0], minlength=k)
        rc = np.bincount(cell[cell >= 0], alt[cell >= 0], minlength=k)
        lam = n * float(((rc - pc) ** 2 / pc).sum())
        chi_power = float(sps.ncx2.sf(sps.chi2.isf(alpha, k - 1), k - 1, lam)) if lam > 0 else alpha
    return 1 - (1 - chi_power) * (1 - outside) ** n


def samples_needed(null: np.ndarray, alt: np.ndarray, alpha: float) -> int | None:
    """Smallest n (to 5%) at which the test detects ``alt`` with probability POWER; None beyond MAX_SAMPLES."""
    hi = 16
    while detection_power(null, alt, hi, alpha) < POWER:
        hi *= 2
        if hi > 8 * MAX_SAMPLES:
            return None
    lo = hi // 2
    while hi - lo > max(1, lo // 20):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if detection_power(null, alt, mid, alpha) >= POWER else (mid, hi)
    return hi


def min_detectable_tv(null: np.ndarray, n: int, alpha: float) -> float:
    """TV above which any alternative is detected with probability POWER (w = sqrt(lambda/n) >= 2 TV)."""
    _, k = cells(null, n)
    if k < 2:
        return float("nan")
    crit = sps.chi2.isf(alpha, k - 1)
    lam = optimize.brentq(lambda x: sps.ncx2.sf(crit, k - 1, x) - POWER, 1e-9, 1e6)
    return min(1.0, math.sqrt(lam / n) / 2)


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def chi2_homogeneity(a: Counter, b: Counter) -> float:
    """Two-sample chi-square over well-filled cells (both samples together >= 10), the rest pooled."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    table = [[a[k], b[k]] for k in keys if a[k] + b[k] >= 2 * MIN_EXPECTED]
    other = [sum(a[k] for k in keys if a[k] + b[k] < 2 * MIN_EXPECTED),
             sum(b[k] for k in keys if a[k] + b[k] < 2 * MIN_EXPECTED)]
    if sum(other) >= 2 * MIN_EXPECTED or (sum(other) and not table):
        table.append(other)
    elif sum(other):
        table[-1] = [table[-1][0] + other[0], table[-1][1] + other[1]]  # the smallest kept cell
    if len(table) < 2:
        return 1.0
    return float(sps.chi2_contingency(np.array(table)).pvalue)


def bootstrap_tv(xs: list, ys: list, rounds: int = 300, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the plug-in TV (itself biased upward when outcomes are sparse)."""
    rng = np.random.default_rng(seed)
    xa, ya = codes(xs, xs + ys), codes(ys, xs + ys)
    vals = [total_variation(Counter(xa[rng.integers(0, len(xa), len(xa))].tolist()),
                            Counter(ya[rng.integers(0, len(ya), len(ya))].tolist())) for _ in range(rounds)]
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def permutation_null(xs: list, ys: list, rounds: int = 300, seed: int = 1) -> np.ndarray:
    """TVs between random relabellings of the pooled samples: what identical distributions give."""
    rng = np.random.default_rng(seed)
    pooled = codes(xs + ys, xs + ys)
    out = []
    for _ in range(rounds):
        perm = rng.permutation(pooled)
        out.append(total_variation(Counter(perm[:len(xs)].tolist()), Counter(perm[len(xs):].tolist())))
    return np.array(out)


def codes(values: list, universe: list) -> np.ndarray:
    """Outcomes (tuples of tokens) as integer codes, so numpy can resample them."""
    index = {v: i for i, v in enumerate(dict.fromkeys(universe))}
    return np.array([index[v] for v in values])
