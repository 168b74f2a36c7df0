"""Losslessness audit: does speculative sampling reproduce the target's distribution?

Samples the same prompt many times with the autoregressive and the speculative decoder
(different seeds) and compares the distributions of the first ``k`` new tokens: total
variation distance with a bootstrap confidence interval, and a two-sample chi-square test of
homogeneity. The first token is also compared with the exact target distribution.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as sps

from explorer.api import decode, encode_prompt
from explorer.models import Models
from explorer.sampling import warp_logits


@dataclass
class AuditResult:
    samples: int
    prefix_tokens: int
    tv_distance: float
    tv_ci95: tuple[float, float]
    tv_null_range: tuple[float, float]  # 95% range of TV between same-size samples of one distribution
    chi2_p_value: float
    permutation_p_value: float
    first_token_tv_exact_ar: float
    first_token_tv_exact_spec: float
    acceptance_rate: float
    verdict: str

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def chi2_homogeneity(a: Counter, b: Counter) -> float:
    """p-value of the two-sample chi-square test; rare outcomes pooled so expected counts are >= 5."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    table, other = [], [0, 0]
    for k in keys:
        if a[k] + b[k] >= 10:
            table.append([a[k], b[k]])
        else:
            other[0] += a[k]
            other[1] += b[k]
    if sum(other):
        table.append(other)
    if len(table) < 2:
        return 1.0
    return float(sps.chi2_contingency(np.array(table)).pvalue)


def bootstrap_tv(xs: list, ys: list, rounds: int = 300, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the plug-in TV (itself biased upward when outcomes are sparse)."""
    rng = np.random.default_rng(seed)
    xa, ya = _codes(xs, xs + ys), _codes(ys, xs + ys)
    vals = [total_variation(Counter(xa[rng.integers(0, len(xa), len(xa))].tolist()),
                            Counter(ya[rng.integers(0, len(ya), len(ya))].tolist())) for _ in range(rounds)]
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def permutation_null(xs: list, ys: list, rounds: int = 300, seed: int = 1) -> np.ndarray:
    """TVs between random relabellings of the pooled samples: what identical distributions give."""
    rng = np.random.default_rng(seed)
    pooled = _codes(xs + ys, xs + ys)
    out = []
    for _ in range(rounds):
        perm = rng.permutation(pooled)
        out.append(total_variation(Counter(perm[:len(xs)].tolist()), Counter(perm[len(xs):].tolist())))
    return np.array(out)


def exact_first_token(models: Models, prompt: str, temperature: float, top_k: int | None,
                      top_p: float | None) -> torch.Tensor:
    ids, _ = encode_prompt(models.tokenizer, prompt, models.preset.chat)
    with torch.inference_mode():
        logits = models.target(input_ids=torch.tensor([ids], device=models.device)).logits[0, -1]
    return warp_logits(logits, temperature, top_k, top_p).cpu()


def run_audit(models: Models, prompt: str, samples: int = 1000, prefix_tokens: int = 2, temperature: float = 1.0,
              top_k: int | None = None, top_p: float | None = None, seed: int = 0, alpha: float = 0.01,
              progress=None, **options) -> AuditResult:
    ar, spec, accepted, proposed = [], [], 0, 0
    for i in range(samples):
        kw = dict(max_new_tokens=prefix_tokens, temperature=temperature, top_k=top_k, top_p=top_p, **options)
        a = decode("autoregressive", models, prompt, seed=seed + 2 * i, **kw)
        s = decode("speculative", models, prompt, seed=seed + 2 * i + 1, **kw)
        ar.append(tuple(a.token_ids))
        spec.append(tuple(s.token_ids))
        accepted += s.stats["accepted"]
        proposed += s.stats["proposed"]
        if progress:
            progress(i + 1, samples)
    ca, cs = Counter(ar), Counter(spec)
    tv = total_variation(ca, cs)
    p_value = chi2_homogeneity(ca, cs)
    exact = exact_first_token(models, prompt, temperature, top_k, top_p).double()
    first_tv = [0.5 * float((exact - _empirical([x[0] for x in xs], exact.shape[0])).abs().sum()) for xs in (ar, spec)]
    null = permutation_null(ar, spec)
    null_range = (float(np.percentile(null, 2.5)), float(np.percentile(null, 97.5)))
    perm_p = float((1 + (null >= tv).sum()) / (1 + len(null)))
    same = p_value >= alpha and perm_p >= alpha
    verdict = (f"PASS: no evidence that speculative sampling changes the distribution (chi-square p = {p_value:.3f}, "
               f"permutation p = {perm_p:.3f}, both >= {alpha}; TV {tv:.3f} lies where identical distributions put it "
               f"at this sample size, {null_range[0]:.3f}-{null_range[1]:.3f})."
               if same else
               f"FAIL: the two distributions differ (chi-square p = {p_value:.2g}, permutation p = {perm_p:.2g}; "
               f"TV {tv:.3f}, identical distributions give {null_range[0]:.3f}-{null_range[1]:.3f}). "
               "Speculative sampling is not lossless here.")
    return AuditResult(samples, prefix_tokens, tv, bootstrap_tv(ar, spec), null_range, p_value, perm_p, first_tv[0],
                       first_tv[1], accepted / proposed if proposed else float("nan"), verdict)


def _empirical(tokens: list[int], vocab: int) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(tokens), minlength=vocab).double()
    return counts / counts.sum()


def _codes(values: list, universe: list) -> np.ndarray:
    """Outcomes (tuples of tokens) as integer codes, so numpy can resample them."""
    index = {v: i for i, v in enumerate(dict.fromkeys(universe))}
    return np.array([index[v] for v in values])
