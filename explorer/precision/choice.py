"""What a preset runs at on this machine, chosen by measurement (not constants), at its first load:

- **the precision**: one target pass over one new token and one over ``rows`` (the preset's longest verify pass)
  for torch's float32 and for each exact precision, after a short prefix; the fastest exact one wins, or float32
  where no exact one is faster (a copy of the target converted per exact precision: a few seconds);
- **the speculative defaults** (γ and the draft cut of the preset's drafter): greedy speculative against greedy
  autoregressive decoding, interleaved, on four held-out chat prompts, for the preset's own setting and plain chains
  of 1, 2 and 3; the fastest is kept (the preset's own while it is within 3% of the fastest), so the default never
  makes the speculative lane slower than autoregressive where any setting is faster (a few seconds more).

The precision is measured at one torch thread (the app's lanes decode at one thread each). The speculative defaults
are measured at the thread count of the decode that reads them: at one thread when the preset loads, and again the
first time a decode runs at another count (``explorer decode`` and the benchmarks use torch's count, the machine's
cores), since a second thread makes the target's pass cheaper and shifts which γ wins. Every choice is kept per
machine and kernel build in ``~/.cache/decoding-explorer/precision-choice.json`` (``EXPLORER_PRECISION_CACHE``
overrides the file), so later loads read them."""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from explorer.decoding.config import DecodeConfig
from explorer.precision import kernels
from explorer.precision.exact import make_row_invariant
from explorer.runtime import ASSETS

PREFIX = 32  # tokens of context before the timed passes
REPS = 3  # passes of each kind per precision; the median is kept


@dataclass(frozen=True)
class PrecisionChoice:
    chosen: str  # "int8", ..., or "float32" (torch's path)
    one_row_ms: dict[str, float]  # precision -> ms of a one-token pass
    k_row_ms: dict[str, float]  # precision -> ms of a ``rows``-token pass
    rows: int
    path: str  # the kernel path it was measured on (kernels.chosen_isa)
    threads: int

    def cost(self, precision: str) -> float:
        """What a precision costs a decode: one autoregressive token plus one verify pass (ms)."""
        return self.one_row_ms[precision] + self.k_row_ms[precision]

    def line(self) -> str:
        """One line for the page, the trace and ``--verbose``: what was chosen and the ms behind it."""
        cells = ", ".join(f"{p} {self.one_row_ms[p]:.0f} / {self.k_row_ms[p]:.0f} ms" for p in self.one_row_ms)
        why = "the fastest exact precision" if self.chosen != "float32" else "no exact precision was faster"
        return (f"{self.chosen}, chosen by measurement on this machine ({why}; one-token / {self.rows}-token "
                f"target pass at {self.threads} thread{'s' * (self.threads > 1)}: {cells}; kernel path {self.path})")


def cache_file() -> Path:
    return Path(os.environ.get("EXPLORER_PRECISION_CACHE",
                               Path.home() / ".cache" / "decoding-explorer" / "precision-choice.json"))


def cache_key(preset: str, rows: int) -> str:
    return f"{preset}|{kernels.build_dir().name}|{rows} rows"


class torch_threads:  # noqa: N801 - used as a context manager
    """Measure at ``n`` torch threads, then give the caller's count back."""

    def __init__(self, n: int = 1):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def _read() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write(key: str, choice: PrecisionChoice) -> None:
    data = _read()
    data[key] = asdict(choice)
    _write_all(data)


def _write_all(data: dict) -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: the choice is made again next time


@torch.inference_mode()
def pass_ms(target: torch.nn.Module, rows: int, reps: int = REPS) -> tuple[float, float]:
    """Median ms of a one-token and of a ``rows``-token target pass after a PREFIX-token prefix (KV cache)."""
    from transformers import DynamicCache  # deferred: transformers cache utils

    vocab = target.get_input_embeddings().num_embeddings
    ids = torch.randint(3, max(4, min(vocab, 5000)), (1, PREFIX + rows), generator=torch.Generator().manual_seed(0))
    device = next(target.parameters()).device
    ids = ids.to(device)
    cache = DynamicCache()
    target(ids[:, :PREFIX], past_key_values=cache, use_cache=True)
    out = []
    for n in (1, rows):
        times = []
        for _ in range(reps + 1):  # the first is a warm-up
            start = time.perf_counter()
            target(ids[:, PREFIX:PREFIX + n], past_key_values=cache, use_cache=True, logits_to_keep=n)
            times.append(time.perf_counter() - start)
            cache.crop(-n)
        out.append(statistics.median(times[1:]) * 1e3)
    return out[0], out[1]


def measure(target: torch.nn.Module, rows: int, candidates: tuple[str, ...]) -> PrecisionChoice:
    """Time torch's float32 target and a converted copy per exact candidate; choose."""
    from explorer.precision import PRECISIONS  # deferred: the package imports this module

    one, many = {}, {}
    one["float32"], many["float32"] = pass_ms(target, rows)
    for precision in candidates:
        converted = make_row_invariant(copy.deepcopy(target), PRECISIONS[precision])
        one[precision], many[precision] = pass_ms(converted, rows)
        del converted
    choice = PrecisionChoice("float32", one, many, rows, kernels.chosen_isa(), torch.get_num_threads())
    best = min(candidates, key=choice.cost) if candidates else None
    if best is not None and choice.cost(best) < choice.cost("float32"):
        choice = PrecisionChoice(best, one, many, rows, choice.path, choice.threads)
    return choice


def choose(preset: str, target: torch.nn.Module, rows: int, candidates: tuple[str, ...]) -> PrecisionChoice:
    """The cached choice for this machine and kernel build, or a new measurement at one thread (then cached)."""
    key = cache_key(preset, rows)
    cached = _read().get(key)
    if cached and set(cached.get("one_row_ms", {})) == {"float32", *candidates}:
        try:
            return PrecisionChoice(**cached)
        except TypeError:
            pass  # an older record: measure again
    with torch_threads(1):
        choice = measure(target, rows, candidates)
    _write(key, choice)
    return choice


# ---- the speculative defaults

SPEC_PROMPTS = 4  # held-out chat prompts decoded per candidate (2 chose a chain 16% slower than the best on others)
SPEC_TOKENS = 32  # new tokens per decode
KEEP_OWN = 0.97  # the preset's own setting stays while it reaches this share of the fastest


@dataclass(frozen=True)
class SpeculativeChoice:
    gamma: int
    draft_confidence: float | None
    speedups: dict[str, float]  # label -> speculative / autoregressive speed, same prompts, interleaved
    prompts: int
    tokens: int
    threads: int  # torch threads it was measured at
    own: tuple[int, float | None]  # the preset's own γ and cut: what another thread count measures against

    @staticmethod
    def label(gamma: int, cut: float | None) -> str:
        return f"γ ≤ {gamma}, cut below {cut:g}" if cut else f"chain of {gamma}"

    def line(self) -> str:
        chosen = self.label(self.gamma, self.draft_confidence)
        others = ", ".join(f"{k} {v:.2f}x" for k, v in self.speedups.items() if k != chosen)
        return (f"speculative default {chosen}: {self.speedups[chosen]:.2f}x autoregressive, measured here at "
                f"{self.threads} thread{'s' * (self.threads > 1)} on {self.prompts} held-out prompts ({self.tokens} "
                f"tokens, greedy; {others})")


def spec_candidates(gamma: int, cut: float | None) -> list[tuple[int, float | None]]:
    out = [(gamma, cut)]
    for g in (1, 2, 3):
        if (g, None) not in out and g <= max(gamma, 3):
            out.append((g, None))
    return out


def time_decode(models, method: str, prompt_ids: list[int], cfg) -> float:
    """Seconds per new token of one greedy decode through the decoders themselves."""
    from explorer.decoding.autoregressive import decode_autoregressive  # deferred: the decoders import transformers
    from explorer.decoding.speculative import decode_speculative  # deferred: as above

    run = decode_autoregressive if method == "autoregressive" else decode_speculative
    start = time.perf_counter()
    events = run(models, prompt_ids, cfg)
    while True:
        try:
            next(events)
        except StopIteration as stop:
            result = stop.value
            break
    return (time.perf_counter() - start) / max(1, len(result.tokens))


def heldout_prompts(n: int) -> list[str]:
    """The first held-out chat prompts (assets/prompts/chat.txt: none of them trained the drafters)."""
    return (ASSETS / "prompts" / "chat.txt").read_text(encoding="utf-8").splitlines()[:n]


def measure_speculative(models, gamma: int, cut: float | None) -> SpeculativeChoice:
    """Greedy autoregressive and greedy speculative at each candidate, per prompt in turn; the fastest candidate."""
    from explorer.decoding.prompting import encode_prompt  # deferred: only a first load measures

    candidates = spec_candidates(gamma, cut)
    ar_s, spec_s = 0.0, dict.fromkeys(candidates, 0.0)
    drafter = models.preset.drafter
    prompts = heldout_prompts(SPEC_PROMPTS)
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(models.tokenizer, prompt, models.preset.chat)[0]
        if i == 0:  # a warm-up
            time_decode(models, "autoregressive", ids, DecodeConfig(max_new_tokens=4))
        ar_s += time_decode(models, "autoregressive", ids, DecodeConfig(max_new_tokens=SPEC_TOKENS))
        for g, c in candidates:
            cfg = DecodeConfig(max_new_tokens=SPEC_TOKENS, gamma=g, draft_confidence=c, drafter=drafter)
            spec_s[(g, c)] += time_decode(models, "speculative", ids, cfg)
    speedups = {SpeculativeChoice.label(g, c): ar_s / spec_s[(g, c)] for g, c in candidates}
    best = max(candidates, key=lambda k: speedups[SpeculativeChoice.label(*k)])
    own = speedups[SpeculativeChoice.label(gamma, cut)]
    if own >= KEEP_OWN * speedups[SpeculativeChoice.label(*best)]:
        best = (gamma, cut)
    return SpeculativeChoice(best[0], best[1], speedups, len(prompts), SPEC_TOKENS, torch.get_num_threads(),
                             (gamma, cut))


def choose_speculative(models, gamma: int, cut: float | None, threads: int = 1) -> SpeculativeChoice:
    """The cached speculative defaults for this machine, kernel build, precision and thread count, or a new
    measurement at ``threads`` (then cached)."""
    key = f"{cache_key(models.preset.name, gamma + 1)}|{models.precision}|speculative {gamma} {cut}|{threads} threads"
    cached = _read().get(key)
    if cached:
        try:
            got = SpeculativeChoice(**{**cached, "own": tuple(cached.get("own", ()))})
            if got.threads == threads and got.own == (gamma, cut):
                return got
        except TypeError:
            pass  # an older record: measure again
    with torch_threads(threads):
        choice = measure_speculative(models, gamma, cut)
    data = _read()
    data[key] = asdict(choice)
    _write_all(data)
    return choice


def speculative_defaults(models, threads: int) -> SpeculativeChoice | None:
    """The speculative defaults a decode at ``threads`` torch threads runs with: the load's own (one thread) or one
    measured at that count (once per machine, then cached), None where the preset's were not measured here."""
    base = models.speculative_choice
    if base is None or base.threads == threads:
        return base
    if threads not in models.speculative_by_threads:
        models.speculative_by_threads[threads] = choose_speculative(models, *base.own, threads=threads)
    return models.speculative_by_threads[threads]
