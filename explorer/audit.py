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
    tv_noise_floor: float  # expected TV between two samples of this size from one distribution
    chi2_p_value: float
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
    rng = np.random.default_rng(seed)
    vals = []
    xa, ya = np.array(xs, dtype=object), np.array(ys, dtype=object)
    for _ in range(rounds):
        bx = Counter(xa[rng.integers(0, len(xa), len(xa))].tolist())
        by = Counter(ya[rng.integers(0, len(ya), len(ya))].tolist())
        vals.append(total_variation(bx, by))
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def noise_floor(xs: list, rounds: int = 100, seed: int = 1) -> float:
    """Mean TV between two same-size resamples of the pooled data: what equal distributions give."""
    rng = np.random.default_rng(seed)
    arr = np.array(xs, dtype=object)
    vals = [total_variation(Counter(arr[rng.integers(0, len(arr), len(arr))].tolist()),
                            Counter(arr[rng.integers(0, len(arr), len(arr))].tolist())) for _ in range(rounds)]
    return float(np.mean(vals))


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
    floor = noise_floor(ar + spec)
    verdict = (f"PASS: no evidence that speculative sampling changes the distribution (chi-square p = {p_value:.3f} "
               f">= {alpha}; TV {tv:.3f} vs {floor:.3f} expected from sampling noise alone)."
               if p_value >= alpha else
               f"FAIL: the two distributions differ (chi-square p = {p_value:.2g} < {alpha}; TV {tv:.3f} vs "
               f"{floor:.3f} expected from noise). Speculative sampling is not lossless in this setting.")
    return AuditResult(samples, prefix_tokens, tv, bootstrap_tv(ar, spec), floor, p_value, first_tv[0], first_tv[1],
                       accepted / proposed if proposed else float("nan"), verdict)


def _empirical(tokens: list[int], vocab: int) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(tokens), minlength=vocab).double()
    return counts / counts.sum()
