"""Which masked positions a diffusion pass commits, and which committed ones it takes back: the diffusion lane's
samplers, one short function each, chosen by ``DecodeConfig.sampler``.

Every rule reads one pass's predictions over the current block (``Pass``) and returns a ``Plan``: the block
positions to reveal, the block positions to re-mask, and why, in words the narration shows. Each rule reveals at
least one masked position; ``revoke`` re-masks at most as many as it reveals, and a position at most once per
block, so a block of B positions ends filled within 2B passes.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

DEFAULT_SAMPLER = "confidence"
DEFAULT_ENTROPY_BOUND = 0.5  # nats; the entropy sampler's bound when none is given
DEFAULT_REVOKE_BELOW = 0.3  # revoke: re-mask a committed token whose probability falls below this
RULE_DEFAULTS = {"entropy_bound": DEFAULT_ENTROPY_BOUND, "revoke_below": DEFAULT_REVOKE_BELOW}  # what None means


@dataclass(frozen=True)
class Pass:
    """One denoiser pass over a block of B positions."""

    tokens: torch.Tensor  # (B,) the token predicted at each position
    confidence: torch.Tensor  # (B,) float64: the score a rule ranks by (the predicted token's probability)
    probs: torch.Tensor | None  # (B, V) float64: the predictive distribution at each position (None: a sampler
    # not in READS_PROBS, which ranks by the confidences alone)
    masked: torch.Tensor  # (B,) bool: still masked before this pass
    canvas: torch.Tensor  # (B,) the tokens on the canvas before this pass (mask id where masked)
    count: int  # how many the step schedule asks for (K passes over the block)
    revocable: torch.Tensor | None = None  # (B,) bool: committed and never masked again in this block
    answer: tuple[int, ...] | None = None  # option no_repeat_ngram: the whole answer before this pass, -1 = masked
    start: int = 0  # the block's first position in ``answer``
    free: frozenset[int] = frozenset()  # tokens an n-gram may repeat (the end of the answer, padding)
    words: Words | None = None  # option no_adjacent_repeat: which tokens spell one word

    @property
    def entropy(self) -> torch.Tensor:
        p = self.probs
        return -(p * torch.log(p.clamp_min(1e-300))).sum(-1)


@dataclass(frozen=True)
class Plan:
    reveal: tuple[int, ...]
    remask: tuple[int, ...] = ()
    why: str = ""
    held: tuple[int, ...] = ()  # chosen by the rule, left masked: it would repeat what another revealed with it made


def _masked_by(score: torch.Tensor, masked: torch.Tensor) -> list[int]:
    """Masked positions, the highest ``score`` first (ties: the leftmost first)."""
    idx = [int(i) for i in masked.nonzero()[:, 0]]
    return sorted(idx, key=lambda i: (-float(score[i]), i))


def by_confidence(p: Pass, threshold: float | None) -> Plan:
    """LLaDA's low-confidence remasking (Nie et al. 2025, Alg. 5): reveal the ``count`` most confident masked
    positions; with a threshold (Fast-dLLM, Wu et al. 2025, Sec. 3.2), every one above it, at least the most
    confident one."""
    order = _masked_by(p.confidence, p.masked)
    if threshold is None:
        return Plan(tuple(order[:max(1, p.count)]), why=f"the {min(len(order), max(1, p.count))} most confident")
    above = [i for i in order if float(p.confidence[i]) > threshold]
    if not above:
        return Plan(tuple(order[:1]), why=f"none above {threshold:g}: the most confident one")
    return Plan(tuple(above), why=f"{len(above)} above the confidence {threshold:g}")


def entropy_bounded(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """EB-sampler's set (Ben-Hamu et al. 2025, arXiv 2505.24857): along the last axis, the lowest-entropy positions
    whose summed entropy minus its largest stays within ``bound``; always at least the lowest. An infinite entropy
    marks a position that may not be chosen. Returns a bool mask the shape of ``entropy``."""
    ordered, order = torch.sort(entropy, dim=-1)
    keep = torch.cumsum(ordered, dim=-1) - ordered <= bound  # inf - inf is NaN: never kept
    return torch.scatter(torch.zeros_like(keep), -1, order, keep)


def by_entropy(p: Pass, bound: float) -> Plan:
    """EB-sampler: reveal masked positions in order of entropy while their summed entropy, less the largest, stays
    under the bound: several near-certain positions together, one uncertain one alone."""
    entropy = torch.where(p.masked, p.entropy, torch.full_like(p.entropy, float("inf")))
    chosen = [int(i) for i in entropy_bounded(entropy, bound).nonzero()[:, 0]]
    chosen = sorted(chosen, key=lambda i: (float(entropy[i]), i))
    total = float(entropy[chosen].sum()) - float(entropy[chosen].max())
    return Plan(tuple(chosen), why=f"{len(chosen)} revealed: summed entropy {total:.2f} (less the largest) "
                                   f"within the bound {bound:g}")


def dilated(p: Pass, threshold: float | None) -> Plan:
    """Non-adjacent scheduling (after Luxembourg et al. 2025, "Plan for Speed: Dilated Scheduling for Masked
    Diffusion Language Models"): as ``by_confidence``, but no two positions revealed in one pass are neighbours,
    so no two neighbours are guessed independently of each other."""
    order = _masked_by(p.confidence, p.masked)
    taken: list[int] = []
    for i in order:
        if taken and (len(taken) >= p.count if threshold is None else float(p.confidence[i]) <= threshold):
            break
        if all(abs(i - j) > 1 for j in taken):
            taken.append(i)
    skipped = (threshold is not None and any(float(p.confidence[i]) > threshold and i not in taken for i in order))
    rule = f"above the confidence {threshold:g}" if threshold is not None else "most confident"
    note = ", their neighbours left for the next pass" if skipped else ""
    return Plan(tuple(taken), why=f"{len(taken)} {rule}, no two adjacent{note}")


def revoke(p: Pass, threshold: float | None, below: float) -> Plan:
    """Revokable decoding (WINO, Hong et al. 2025; ReMDM's remasking, Wang et al. 2025): reveal generously (as
    ``by_confidence``), and re-check every token committed by an earlier pass of the block against this pass's
    prediction, which now sees its neighbours: one whose probability has fallen below ``below`` is masked again,
    the least likely first, at most as many as this pass reveals and each position once per block."""
    plan = by_confidence(p, threshold)
    revocable = ~p.masked if p.revocable is None else p.revocable & ~p.masked
    committed = revocable.nonzero()[:, 0]
    now = p.probs[committed, p.canvas[committed]] if len(committed) else p.probs.new_zeros(0)
    fallen = sorted((float(c), int(i)) for c, i in zip(now, committed, strict=True) if float(c) < below)
    remask = tuple(i for _, i in fallen[:len(plan.reveal)])
    if not remask:
        return plan
    return Plan(plan.reveal, remask, why=f"{plan.why}; {len(remask)} re-masked, below {below:g} now")


# ---- repeated neighbours (any sampler): option ``no_adjacent_repeat``

WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")  # a word as the repeat rate counts one (measure/workload.py)


@dataclass(frozen=True)
class Words:
    """Which tokens spell the same word. ``key`` (V,): one number per word, whatever its case and leading
    whitespace ("plants", " plants", " Plants"), -1 for a token that is no whole word (punctuation, whitespace,
    symbols); ``starts`` (V,): the token begins a new word (leading whitespace); ``whole`` (V,): the token is a word
    of three letters or more, which glued to itself makes no word ("pythonpython", "setset")."""

    key: torch.Tensor
    starts: torch.Tensor
    whole: torch.Tensor

    @staticmethod
    def of(pieces: list[str]) -> Words:
        """From each token's text."""
        keys: dict[str, int] = {}
        key = [keys.setdefault(w, len(keys)) if WORD.fullmatch(w := t.strip().lower()) else -1 for t in pieces]
        starts = [t[:1].isspace() for t in pieces]
        whole = [len(w := t.strip()) >= 3 and w.isalpha() for t in pieces]
        return Words(*(torch.tensor(x, device="cpu") for x in (key, starts, whole)))  # tables, indexed on the CPU

    @functools.cached_property
    def second(self) -> torch.Tensor:
        """(V,) bool: the tokens that repeat the same word before them: a new word, or a whole word glued on."""
        return self.starts | self.whole

    def repeat(self, a: int, b: int) -> bool:
        """Token b right after token a repeats a's word ("plants plants", "of of", "pythonpython"). A short piece or
        a digit glued to the same ("1" "0" "0": 100, "is" "is": Isis) repeats nothing; a token that is no word
        repeats only itself (", ,")."""
        ka = int(self.key[a])
        return (ka == int(self.key[b]) and bool(self.second[b])) if ka >= 0 else a == b

    def after(self, a: int) -> torch.Tensor:
        """(V,) bool: the tokens b with repeat(a, b)."""
        ka = int(self.key[a])
        if ka < 0:
            return torch.arange(len(self.key), device=self.key.device) == a
        return (self.key == ka) & self.second

    def before(self, b: int) -> torch.Tensor:
        """(V,) bool: the tokens a with repeat(a, b)."""
        kb = int(self.key[b])
        if kb < 0:
            return torch.arange(len(self.key), device=self.key.device) == b
        return self.key == kb if bool(self.second[b]) else torch.zeros_like(self.starts)


def _word_beyond(line: list[int], i: int, step: int, words: Words) -> tuple[int, int]:
    """From position i of ``line`` (-1 = masked) towards ``step``: (the first filled word, how many filled tokens
    that are no word lie between), or (-1, n) where a mask or the edge comes first."""
    j, skipped = i + step, 0
    while 0 <= j < len(line) and line[j] >= 0 and int(words.key[line[j]]) < 0:
        j, skipped = j + step, skipped + 1
    return (line[j] if 0 <= j < len(line) and line[j] >= 0 else -1), skipped


def across_punctuation(answer: list[int], i: int, step: int, words: Words, reach: int = 3) -> int:
    """The word nearest position i of ``answer`` (-1 = masked) on one side (``step`` -1: left, +1: right) with only
    filled tokens that are no word between (punctuation, whitespace: 1 to ``reach`` of them), or -1: the word that
    "plants, plants" or "language. Language" would repeat, which the repeat rate counts and the neighbour's ban
    does not see."""
    word, skipped = _word_beyond(answer, i, step, words)
    return word if 1 <= skipped <= reach else -1


def bridges_repeat(answer: list[int], i: int, words: Words, reach: int = 3) -> bool:
    """Punctuation at position i of ``answer`` (-1 = masked) would join two spellings of one word with at most
    ``reach`` tokens that are no word between ("moment [mask] moment", "language, [mask] language"): a gap left
    between two equal words revealed apart, which no word ban sees."""
    (left, n_left), (right, n_right) = _word_beyond(answer, i, -1, words), _word_beyond(answer, i, 1, words)
    return left >= 0 and right >= 0 and n_left + n_right + 1 <= reach and int(words.key[left]) == int(words.key[right])


def ban_words(logits: torch.Tensor, far: list[tuple[int, int]], words: Words, bridges: list[bool] | None = None,
              inplace: bool = False) -> torch.Tensor:
    """The block's logits (B, V) with, for each position, every spelling of the words in ``far`` (its
    ``across_punctuation`` word on the left and on the right, -1: none) taken out: across punctuation or a line break
    a token starts a new word whether or not it carries a space ("language.\nLanguage", "8, 8"); where ``bridges``
    (``bridges_repeat``), every token that is no word. ``inplace``: into ``logits`` itself."""
    out = logits if inplace else logits.clone()
    for row, sides in enumerate(far):
        for t in filter(lambda t: t >= 0, sides):
            hit = words.key == words.key[t]
            out[row, :len(hit)][hit.to(out.device)] = float("-inf")
        if bridges is not None and bridges[row]:
            out[row, :len(words.key)][(words.key < 0).to(out.device)] = float("-inf")
    return out


def ban_repeats(logits: torch.Tensor, left: torch.Tensor, right: torch.Tensor, words: Words | None = None,
                inplace: bool = False) -> torch.Tensor:
    """The block's logits (B, V) with each position's filled neighbours' words taken out (``left`` and ``right``:
    the token beside each position, -1 where that is masked or outside the answer; ``words``: which tokens spell
    one word, None: each token its own). HF's ``no_repeat_ngram_size`` at n = 2 asks the same of left-to-right
    text; a denoiser needs it on both sides, because it predicts a position from its left context mostly and so
    repeats the word a neighbour already holds ("Sleep is is"): the default partner gave the repeat a logit 14 nats
    above the next token, past any finite penalty (BENCHMARKS.md). ``inplace``: into ``logits`` itself."""
    out = logits if inplace else logits.clone()
    for row in range(len(out)):
        for side, ban in ((int(left[row]), "after"), (int(right[row]), "before")):
            if side < 0:
                continue
            if words is None:
                out[row, side] = float("-inf")
            else:
                hit = getattr(words, ban)(side)
                out[row, :len(hit)][hit.to(out.device)] = float("-inf")
    return out


def _clash(line: list[int], i: int, words: Words | None, reach: int = 3) -> bool:
    """The token at position i of ``line`` makes a repeat there: the same word as the filled token beside it, or as
    the nearest word across 1 to ``reach`` filled tokens that are no word ("python\npython", "moment, moment"); a
    punctuation token clashes where it joins two such words, or repeats its neighbour (", ,")."""
    t = line[i]
    for step in (-1, 1):
        j = i + step
        if 0 <= j < len(line) and line[j] >= 0:
            a, b = (line[j], t) if step < 0 else (t, line[j])
            if words.repeat(a, b) if words is not None else a == b:
                return True
    if words is None:
        return False
    if int(words.key[t]) >= 0:
        for step in (-1, 1):
            far, skipped = _word_beyond(line, i, step, words)
            if far >= 0 and 1 <= skipped <= reach and int(words.key[far]) == int(words.key[t]):
                return True
        return False
    return bridges_repeat(line, i, words, reach)


def apart_repeats(plan: Plan, tokens: torch.Tensor, confidence: torch.Tensor, words: Words | None = None,
                  canvas: list[int] | None = None) -> Plan:
    """No token revealed by a pass repeats a neighbour's word (``words``; None: the same token), nor, with ``words``,
    the nearest word across the punctuation revealed with it or already on ``canvas`` (the block before the pass, -1
    where masked; None: an empty block), as "python\npython" revealed at once would: in order of confidence each token
    goes on the block unless it makes such a repeat there, else it is held back (left masked) for a pass that sees
    the other; at least one position is always revealed; a plan that re-masks keeps at most as many re-masked as
    revealed."""
    line = list(canvas) if canvas is not None else [-1] * len(tokens)
    kept: list[int] = []
    for i in sorted(plan.reveal, key=lambda i: (-float(confidence[i]), i)):
        line[i] = int(tokens[i])
        if kept and _clash(line, i, words):
            line[i] = -1
        else:
            kept.append(i)
    held = tuple(i for i in plan.reveal if i not in kept)
    if not held:
        return plan
    reveal = tuple(i for i in plan.reveal if i in kept)
    return Plan(reveal, plan.remask[:len(reveal)], f"{plan.why}; {len(held)} held back beside the same word", held)


# ---- repeated phrases (any sampler): option ``no_repeat_ngram``

def _whole(answer: list[int], s: int, n: int, free: frozenset[int]) -> bool:
    return all(answer[j] >= 0 and answer[j] not in free for j in range(s, s + n))


def ngram_bans(answer: list[int], positions: range, n: int, free: frozenset[int] = frozenset()) -> dict[int, set[int]]:
    """HF's ``no_repeat_ngram_size`` for a canvas filled in any order: for each masked position among ``positions``
    (of ``answer``, -1 where masked), the tokens that would complete an n-gram the answer already holds, in any
    window of n positions around it whose other n - 1 are filled. An n-gram holding a ``free`` token (the end of
    the answer, its padding) is never banned: an answer ends in a run of them."""
    holes: dict[tuple[int, ...], set[int]] = {}  # (offset of the hole, the other n - 1 tokens) -> tokens seen there
    for s in range(len(answer) - n + 1):
        if _whole(answer, s, n, free):
            g = answer[s:s + n]
            for o in range(n):
                holes.setdefault((o, *g[:o], *g[o + 1:]), set()).add(g[o])
    out: dict[int, set[int]] = {}
    for i in positions:
        if answer[i] >= 0:
            continue
        for s in range(max(0, i - n + 1), min(i, len(answer) - n) + 1):
            others = [answer[j] for j in range(s, s + n) if j != i]
            if all(t >= 0 and t not in free for t in others) and (hit := holes.get((i - s, *others))):
                out.setdefault(i, set()).update(hit)
    return out


def repeated_ngram(answer: list[int], i: int, n: int, free: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """An n-gram through position i of ``answer`` that the answer holds elsewhere too (the first), or ()."""
    through = [tuple(answer[s:s + n]) for s in range(max(0, i - n + 1), min(i, len(answer) - n) + 1)
               if _whole(answer, s, n, free)]
    if not through:  # no whole n-gram through i (a mask beside it): nothing to count
        return ()
    grams = Counter(tuple(answer[s:s + n]) for s in range(len(answer) - n + 1) if _whole(answer, s, n, free))
    return next((g for g in through if grams[g] > 1), ())


def apart_ngrams(plan: Plan, p: Pass, n: int) -> Plan:
    """No pass reveals positions that together repeat an n-gram: in order of confidence each revealed token goes on
    the canvas unless it completes a repeat there, else it is held back for a pass that sees the others; the most
    confident is always revealed; a plan that re-masks keeps at most as many re-masked as revealed."""
    answer = list(p.answer or ())
    kept: list[int] = []
    for i in sorted(plan.reveal, key=lambda i: (-float(p.confidence[i]), i)):
        answer[p.start + i] = int(p.tokens[i])
        if kept and repeated_ngram(answer, p.start + i, n, p.free):
            answer[p.start + i] = -1
        else:
            kept.append(i)
    held = tuple(i for i in plan.reveal if i not in kept)
    if not held:
        return plan
    reveal = tuple(i for i in plan.reveal if i in kept)
    return Plan(reveal, plan.remask[:len(reveal)], f"{plan.why}; {len(held)} held back: a repeated {n}-gram",
                plan.held + held)


RULES: dict[str, Callable[..., Plan]] = {
    "confidence": lambda p, cfg: by_confidence(p, cfg.threshold),
    "entropy": lambda p, cfg: by_entropy(p, cfg.entropy_bound if cfg.entropy_bound is not None
                                         else DEFAULT_ENTROPY_BOUND),
    "dilated": lambda p, cfg: dilated(p, cfg.threshold),
    "revoke": lambda p, cfg: revoke(p, cfg.threshold, cfg.revoke_below if cfg.revoke_below is not None
                                    else DEFAULT_REVOKE_BELOW),
}


READS_PROBS = frozenset({"entropy", "revoke"})  # the rules that read Pass.probs (the others get None: no (B, V)
# softmax a pass); a new rule that reads it is named here too

SAMPLERS = tuple(RULES)  # a new rule: one function above and one line in RULES reach the API, CLI, page and tests


def plan_pass(p: Pass, cfg: object) -> Plan:
    """The plan of ``cfg.sampler`` (a DecodeConfig) for this pass; with ``no_adjacent_repeat``, no two neighbours
    revealed together with the same token (``apart_repeats``); with ``no_repeat_ngram``, no repeated n-gram made
    by the tokens revealed together (``apart_ngrams``)."""
    plan = RULES[cfg.sampler](p, cfg)  # type: ignore[attr-defined]
    if getattr(cfg, "no_adjacent_repeat", False):
        canvas = [-1 if bool(m) else int(t) for t, m in zip(p.canvas, p.masked, strict=True)]
        plan = apart_repeats(plan, p.tokens, p.confidence, p.words, canvas)
    if getattr(cfg, "no_repeat_ngram", 0) and p.answer is not None:
        plan = apart_ngrams(plan, p, cfg.no_repeat_ngram)  # type: ignore[attr-defined]
    return plan
