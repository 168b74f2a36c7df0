"""Decoding options: one dataclass whose fields each carry their whole description (help, setup, page control),
validated in one place (``validate``)."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from explorer.decoding.unmasking import DEFAULT_ENTROPY_BOUND, DEFAULT_REVOKE_BELOW, DEFAULT_SAMPLER, SAMPLERS
from explorer.errors import ExplorerError

METHODS = ("autoregressive", "speculative", "diffusion")
DRAFTERS = ("model", "prompt_lookup", "early_exit", "diffusion", "assistant")
REMASKING = ("low_confidence", "random")
CACHES = ("none", "prefix", "dual", "delayed")  # diffusion KV cache (Fast-dLLM, Wu et al. 2025, Sec. 3.1; dKV-Cache)
# The cache when the option is None, wherever the model takes a KV cache: "dual", the measured choice (2.1x at
# N = 128 on tiny and 2.75x at N = 64 on smollm2-135m, perplexity unchanged: BENCHMARKS.md, diffusion KV cache).
DEFAULT_CACHE = "dual"
SWEEP_CACHE = "dual"  # what the break-even sweep decodes with
TREE_DRAFTERS = ("model", "early_exit", "assistant")  # the drafters that give a distribution per tree node
MAX_TREE_NODES, MAX_TREE_DEPTH = 256, 32


@dataclass(frozen=True)
class Control:
    """How the page shows an option (explorer/app/controls.py builds it from this): ``kind`` is "slider" (``lo``,
    ``hi``, ``step``), "choice" (``choices``: values, or (label, value) pairs), "check", "text" or "number". ``off``
    is the control's value that means None (the option's own default: off, or the preset's); ``default`` the
    control's starting value where it is not the option's. ``page_name``: the control sets a page value from which
    the option is made (diffusion's K and block length are fractions of N on the page). ``more``: under "more
    options", closed."""

    kind: str
    label: str
    lo: float = 0
    hi: float = 1
    step: float = 1
    choices: tuple[Any, ...] = ()
    off: Any = None
    default: Any = None
    info: str = ""
    elem_id: str | None = None
    page_name: str | None = None
    more: bool = False


@dataclass(frozen=True)
class Option:
    """What one decode option is, in one place. ``methods``: the methods whose setup it is part of (it changes
    their output distribution or their cost; none for the seed, which picks a sample); ``help``: its sentence (the
    CLI's --help, the bench's flags); ``control``: how the page shows it; ``applies(method, values)``: whether it
    acts, given the other options (the page passes an option only where it acts)."""

    methods: tuple[str, ...]
    help: str
    control: Control
    applies: Callable[[str, Mapping[str, Any]], bool] | None = None


def option(default: Any, methods: tuple[str, ...], help: str, control: Control,
           applies: Callable[[str, Mapping[str, Any]], bool] | None = None) -> Any:
    return field(default=default, metadata={"option": Option(methods, help, control, applies)})


ALL, SPEC, DIFF = METHODS, ("speculative",), ("diffusion",)


def _drafter_is(name: str) -> Callable[[str, Mapping[str, Any]], bool]:
    return lambda method, v: v.get("drafter") == name


def _sampler_is(*names: str) -> Callable[[str, Mapping[str, Any]], bool]:
    return lambda method, v: v.get("sampler", DEFAULT_SAMPLER) in names


def _cuts_a_chain(method: str, v: Mapping[str, Any]) -> bool:
    return not str(v.get("tree") or "").strip() and v.get("drafter") in TREE_DRAFTERS


def _cache_applies(method: str, v: Mapping[str, Any]) -> bool:
    return method == "diffusion" or v.get("drafter") == "diffusion"


@dataclass(frozen=True)
class DecodeConfig:
    """Every option of a decode, each with its whole description (``Option``): the CLI flags (explorer/flags.py),
    the page's controls (explorer/app/controls.py), the setup key (``SETUP_OPTIONS``) and the help all read it,
    so a new option is one field here (and its range in ``validate``)."""

    max_new_tokens: int = option(64, ALL, "tokens to generate (N)",
                                 Control("slider", "max new tokens (N)", 8, 256, 8, elem_id="max-new"))
    temperature: float = option(0.0, ALL, "0 = greedy; target and draft are warped alike by temperature, top-k, top-p",
                                Control("slider", "temperature (0 = greedy)", 0, 2, 0.05, elem_id="temperature"))
    top_p: float | None = option(None, ALL, "sample among the smallest set of tokens whose probability reaches "
                                 "top_p, in (0, 1] (default: off)",
                                 Control("slider", "top-p (1 = off)", 0.05, 1, 0.05, off=1.0))
    top_k: int | None = option(None, ALL, "sample among the k most likely tokens only (default: off)",
                               Control("slider", "top-k (0 = off)", 0, 200, 1, off=0, more=True))
    seed: int = option(0, (), "seed of the one sampling generator a decode uses", Control("number", "seed"))
    # speculative
    drafter: str = option("model", SPEC, f"speculative: {', '.join(DRAFTERS)} (default: the preset's)",
                          Control("choice", "drafter", choices=DRAFTERS))
    gamma: int = option(4, SPEC, "speculative: tokens drafted per step, 1..64 (default: the preset's)",
                        Control("slider", "γ (drafts per step, at most)", 1, 16, 1, elem_id="gamma"))
    draft_confidence: float | None = option(
        None, SPEC, "speculative: stop a chain's draft once the product of the drafter's probabilities of its tokens "
        "(untempered softmax; EAGLE-2's value of a draft) falls below this, in (0, 1]; gamma is then the longest "
        f"draft; drafters {', '.join(TREE_DRAFTERS)} (default: off)",
        Control("slider", "stop the draft below this probability (0 = always γ)", 0, 0.95, 0.05, off=0.0,
                elem_id="draft-confidence", info="a chain's draft ends once the drafter's probability of all of it "
                "falls below this (EAGLE-2's value of a draft); γ is then the longest draft"), _cuts_a_chain)
    # a token tree: None or "" = a chain of gamma drafts; "3,2,1" branching per depth; "dynamic:16"
    tree: str | None = option(
        None, SPEC, "speculative: draft a token tree instead of a chain: '3,2,1' = children per depth, 'dynamic:16' "
        f"= best-first by cumulative draft probability up to 16 nodes (drafters {', '.join(TREE_DRAFTERS)}; "
        "default: chain)",
        Control("text", "token tree (empty: a chain of γ)", off="", elem_id="tree",
                info="branching per depth (e.g. 3,2,1), or EAGLE-2's dynamic tree of N nodes (dynamic:16); drafters "
                     f"{', '.join(TREE_DRAFTERS)} (an EAGLE head), every precision"))
    adaptive_gamma: bool = option(False, SPEC, "speculative: gamma +2 after a full acceptance, -1 after a rejection "
                                  "(up to 16)", Control("check", "adaptive γ (+2 after a full acceptance, −1 after "
                                                        "a rejection)"))
    max_ngram: int = option(3, SPEC, "prompt_lookup drafter: the longest n-gram it matches",
                            Control("slider", "prompt lookup: longest n-gram", 1, 8, 1, more=True),
                            _drafter_is("prompt_lookup"))
    early_exit_layers: int | None = option(
        None, SPEC, "early_exit drafter: target layers it runs (default: the preset's, else a third)",
        Control("slider", "early exit: target layers it runs (0 = the preset's)", 0, 32, 1, off=0, more=True),
        _drafter_is("early_exit"))
    draft_passes: int = option(1, SPEC, "diffusion drafter: denoiser passes per draft",
                               Control("slider", "diffusion drafter: passes per draft", 1, 8, 1, more=True),
                               _drafter_is("diffusion"))
    # diffusion
    sampler: str = option(
        DEFAULT_SAMPLER, DIFF, f"diffusion: which masked positions a pass reveals: {', '.join(SAMPLERS)} (confidence: "
        "the most confident, or all above the threshold; entropy: lowest entropy first within entropy_bound "
        "(EB-sampler); dilated: as confidence, never two neighbours in one pass; revoke: as confidence, and tokens "
        "whose probability falls below revoke_below are masked again (WINO))",
        Control("choice", "sampler (which masks a pass reveals)", choices=SAMPLERS, elem_id="sampler",
                info="confidence: the most confident (or all above the threshold); entropy: lowest entropy first "
                     "within a bound (EB-sampler); dilated: never two neighbours in one pass; revoke: tokens whose "
                     "probability falls are masked again (WINO)"))
    steps: int | None = option(
        None, DIFF, "diffusion: denoiser passes K, a multiple of the number of blocks, <= N (default: N)",
        Control("choice", "steps K (tokens revealed per pass = N/K)", page_name="tokens_per_step", default=2,
                choices=tuple((f"N/{r}" if r > 1 else "N (one token a pass)", r) for r in (1, 2, 4, 8)),
                elem_id="tokens-per-step"))
    block_length: int | None = option(
        None, DIFF, "diffusion: block length, divides N; blocks are filled left to right (default: N)",
        Control("choice", "block length (blocks are filled left to right)", page_name="blocks", default=4,
                choices=tuple((f"N/{b}" if b > 1 else "N (one block)", b) for b in (1, 2, 4, 8))))
    remasking: str = option("low_confidence", DIFF,
                            f"diffusion: which predictions a pass keeps: {', '.join(REMASKING)}",
                            Control("choice", "remasking", choices=REMASKING))
    threshold: float | None = option(
        None, DIFF, "diffusion: also reveal every position above this confidence, in (0, 1] (Fast-dLLM; "
        "default: off)",
        Control("slider", "confidence threshold (0 = off)", 0, 1, 0.05, off=0.0, elem_id="threshold",
                info="samplers confidence, dilated and revoke"), _sampler_is("confidence", "dilated", "revoke"))
    entropy_bound: float | None = option(
        None, DIFF, "diffusion, sampler entropy (and DiffusionGemma): the bound on a pass's summed entropy in nats, "
        f"> 0 (default: {DEFAULT_ENTROPY_BOUND:g}; DiffusionGemma's own)",
        Control("slider", f"entropy bound, nats (0 = default {DEFAULT_ENTROPY_BOUND:g})", 0, 3, 0.05, off=0.0,
                info="sampler entropy", elem_id="entropy-bound"), _sampler_is("entropy"))
    revoke_below: float | None = option(
        None, DIFF, "diffusion, sampler revoke: re-mask a committed token whose probability falls below this, in "
        f"(0, 1) (default: {DEFAULT_REVOKE_BELOW:g})",
        Control("slider", f"re-mask below this probability (0 = default {DEFAULT_REVOKE_BELOW:g})", 0, 0.95, 0.05,
                off=0.0, info="sampler revoke", elem_id="revoke-below"), _sampler_is("revoke"))
    no_adjacent_repeat: bool = option(
        False, DIFF, "diffusion, every sampler: never reveal a word equal to a filled neighbour's (any spelling of "
        "it: \"plants\", \" Plants\"; a whole word glued to itself: \"pythonpython\"; or across 1-3 filled "
        "punctuation tokens: \"plants, plants\"), nor punctuation between two equal words, nor tokens that make "
        "such a repeat together in one pass",
        Control("check", "never the same word twice in a row", elem_id="no-adjacent-repeat",
                info="stops \"plants plants\": a position never gets the word beside it, and two neighbours never "
                     "the same word in one pass"))
    no_repeat_ngram: int = option(
        0, DIFF, "diffusion, every sampler: never reveal a token that completes an n-gram of this many tokens the "
        "answer already holds, nor tokens that make one together in one pass (HF's no_repeat_ngram_size, on both "
        "sides of a masked position); 0 = off, else 2..8",
        Control("choice", "never repeat a phrase of n tokens",
                choices=(("off", 0), *((str(k), k) for k in range(2, 9))),
                info="stops loops (\"a gentle of the, a gentle of the\"): no n tokens in a row twice in one answer",
                elem_id="no-repeat-ngram"))
    cache: str | None = option(
        None, SPEC + DIFF, "diffusion KV cache (the diffusion lane's and the diffusion drafter's): "
        f"{', '.join(CACHES)} (default: {DEFAULT_CACHE!r} where the model takes one)",
        Control("choice", "KV cache (Fast-dLLM)", choices=CACHES, default=DEFAULT_CACHE,
                info="prefix: prompt and finished blocks; dual: also the masked suffix; delayed: dual, but a "
                     "block's first pass refeeds only the block just finished. Approximate."), _cache_applies)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def diffusion_steps(self) -> int:
        return self.steps if self.steps is not None else self.max_new_tokens

    @property
    def diffusion_block_length(self) -> int:
        return self.block_length if self.block_length is not None else self.max_new_tokens


OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in fields(DecodeConfig)}
OPTION_HELP = {name: o.help for name, o in OPTIONS.items()}  # the CLI's --help, the bench's flags, docs/design.md

# What a decode's setup is: every option its output distribution or its cost depends on, per method (each
# option's ``methods``): Measure's rows, the latency plot's series, the run history's pooled speedups and the
# bench's labels all key on ``setup_label``, so two decodes that differ in any of these are never pooled. The
# method's own options first, then these, in this order (a label reads "model · γ=4 · ... · T=0 · N=64").
COMMON_SETUP = ("temperature", "top_k", "top_p", "max_new_tokens")
SETUP_OPTIONS = {m: tuple(n for n, o in OPTIONS.items() if m in o.methods and n not in COMMON_SETUP) + COMMON_SETUP
                 for m in METHODS}
NOT_SETUP = tuple(n for n, o in OPTIONS.items() if not o.methods)  # the seed: it picks a sample, not a setup
# how a setup label names an option (the rest by their own name)
SETUP_NAMES = {"max_new_tokens": "N", "temperature": "T", "gamma": "γ", "draft_confidence": "cut", "steps": "K",
               "block_length": "block", "top_k": "top-k", "top_p": "top-p", "no_adjacent_repeat": "no repeats",
               "no_repeat_ngram": "no repeated n-gram"}
ALWAYS_SHOWN = ("max_new_tokens", "temperature", "drafter", "gamma", "sampler", "steps", "block_length")


def option_type(name: str) -> type:
    """The plain type of option ``name`` (bool, int, float or str), read from its annotation (``int | None``: int)."""
    kind = typing.get_type_hints(DecodeConfig)[name]
    return next(t for t in (bool, int, float, str) if kind is t or t in typing.get_args(kind))


def applies(name: str, method: str, values: Mapping[str, Any]) -> bool:
    """Whether option ``name`` acts in a ``method`` decode with these option values (a setup's or the page's)."""
    o = OPTIONS[name]
    if o.methods and method not in o.methods:
        return False
    return o.applies is None or o.applies(method, values)


def setup_items(method: str, config: Any, precision: str | None = None) -> tuple[tuple[str, Any], ...]:
    """(option, value) of every option in ``method``'s setup (``config``: a DecodeConfig or a trace's config dict),
    then the precision it ran at. Diffusion's steps and block length default to N, as the decoder reads them."""
    values = config.as_dict() if isinstance(config, DecodeConfig) else dict(config)
    items = []
    for name in SETUP_OPTIONS.get(method, COMMON_SETUP):
        value = values.get(name)
        if name in ("steps", "block_length") and value is None:
            value = values.get("max_new_tokens")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        items.append((name, value))
    return (*items, ("precision", precision))


def setup_label(method: str, config: Any, precision: str | None = None) -> str:
    """A setup in words, e.g. "model · γ=4 · cut=0.15 · T=0 · N=64 · int8": the options that always matter, then
    every other one of the setup that is not at its default."""
    defaults = DecodeConfig().as_dict()
    bits = []
    for name, value in setup_items(method, config, precision):
        if name == "precision":
            bits.append(str(value) if value is not None else "precision ?")
        elif name in ("drafter", "sampler"):
            bits.append(str(value))
        elif name in ALWAYS_SHOWN or value != defaults.get(name):
            shown = "off" if value is None else f"{value:g}" if isinstance(value, float) else value
            bits.append(f"{SETUP_NAMES.get(name, name)}={shown}")
    return " · ".join(bits)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ExplorerError(message)


def validate(method: str, cfg: DecodeConfig) -> None:
    """Check every option against its range; raise ExplorerError with one clear sentence."""
    _require(method in METHODS, f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    _require(_is_int(cfg.max_new_tokens) and cfg.max_new_tokens >= 1,
             f"max_new_tokens must be a whole number >= 1 (got {cfg.max_new_tokens!r})")
    t = cfg.temperature
    _require(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0,
             f"temperature must be a finite number >= 0 (got {t!r})")
    _require(cfg.top_k is None or (_is_int(cfg.top_k) and cfg.top_k >= 1), f"top_k must be >= 1 (got {cfg.top_k!r})")
    _require(cfg.top_p is None or (isinstance(cfg.top_p, (int, float)) and 0 < cfg.top_p <= 1),
             f"top_p must be in (0, 1] (got {cfg.top_p!r})")
    _require(_is_int(cfg.seed), f"seed must be a whole number (got {cfg.seed!r})")
    _require(cfg.cache is None or cfg.cache in CACHES,
             f"unknown cache {cfg.cache!r}; choose one of {', '.join(CACHES)}")
    if method == "speculative":
        _require(_is_int(cfg.gamma) and 1 <= cfg.gamma <= 64, f"gamma must be between 1 and 64 (got {cfg.gamma!r})")
        _require(cfg.drafter in DRAFTERS, f"unknown drafter {cfg.drafter!r}; choose one of {', '.join(DRAFTERS)}")
        _require(_is_int(cfg.max_ngram) and cfg.max_ngram >= 1, "max_ngram must be >= 1")
        _require(_is_int(cfg.draft_passes) and cfg.draft_passes >= 1,
                 f"draft_passes must be a whole number >= 1 (got {cfg.draft_passes!r})")
        c = cfg.draft_confidence
        _require(c is None or (isinstance(c, (int, float)) and not isinstance(c, bool) and 0 < c <= 1),
                 f"draft_confidence must be in (0, 1] (got {c!r})")
        _require(c is None or cfg.drafter in TREE_DRAFTERS, f"draft_confidence needs a drafter that gives a "
                 f"distribution per token ({', '.join(TREE_DRAFTERS)}); the {cfg.drafter} drafter gives none")
        _require(c is None or parse_tree(cfg.tree) is None, "draft_confidence cuts a chain; a tree has its own shape "
                 "(turn one of them off)")
        if parse_tree(cfg.tree) is not None:
            _require(cfg.drafter in TREE_DRAFTERS, f"the {cfg.drafter} drafter cannot branch (it gives no distribution "
                     f"per tree node); trees need drafter {', '.join(TREE_DRAFTERS)}")
            _require(not cfg.adaptive_gamma, "adaptive_gamma changes a chain's length; a tree has its own shape "
                     "(turn one of them off)")
    if method == "diffusion":
        _validate_diffusion(cfg)


@dataclass(frozen=True)
class TreeShape:
    """A draft tree's shape: static branching factors per depth, or a dynamic node budget (EAGLE-2)."""

    branching: tuple[int, ...] = ()  # static: children of every node at depth d - 1 for d = 1..len
    budget: int = 0  # dynamic: nodes in all

    @property
    def max_nodes(self) -> int:
        if self.budget:
            return self.budget
        total, width = 0, 1
        for b in self.branching:
            width *= b
            total += width
        return total

    @property
    def max_depth(self) -> int:
        return self.budget or len(self.branching)


def parse_tree(spec: Any) -> TreeShape | None:
    """``None``/"" -> None (a chain); "3,2,1" -> static branching; "dynamic:16" -> a 16-node budget."""
    if spec is None or (isinstance(spec, str) and spec.strip() == ""):
        return None
    _require(isinstance(spec, str), f"tree must be text such as '3,2,1' or 'dynamic:16' (got {spec!r})")
    text = spec.strip().lower()
    if text.startswith("dynamic:"):
        n = text.removeprefix("dynamic:").strip()
        _require(n.isdigit() and 1 <= int(n) <= MAX_TREE_NODES,
                 f"tree {spec!r}: 'dynamic:N' needs a node budget N between 1 and {MAX_TREE_NODES}")
        return TreeShape(budget=int(n))
    parts = [x.strip() for x in text.split(",")]
    _require(all(x.isdigit() and int(x) >= 1 for x in parts) and len(parts) <= MAX_TREE_DEPTH,
             f"tree {spec!r} is not a shape: give children per depth as whole numbers >= 1 such as '3,2,1' "
             f"(at most {MAX_TREE_DEPTH} depths), or 'dynamic:16'")
    shape = TreeShape(branching=tuple(int(x) for x in parts))
    _require(shape.max_nodes <= MAX_TREE_NODES,
             f"tree {spec!r} has {shape.max_nodes} nodes; at most {MAX_TREE_NODES} are verified in one pass")
    return shape


def _validate_diffusion(cfg: DecodeConfig) -> None:
    n, k, b = cfg.max_new_tokens, cfg.diffusion_steps, cfg.diffusion_block_length
    _require(_is_int(k) and k >= 1, f"steps must be a whole number >= 1 (got {k!r})")
    _require(_is_int(b) and b >= 1, f"block_length must be a whole number >= 1 (got {b!r})")
    _require(b <= n, f"block_length ({b}) cannot exceed max_new_tokens ({n})")
    _require(n % b == 0, f"max_new_tokens ({n}) must be a multiple of block_length ({b})")
    blocks = n // b
    _require(k % blocks == 0, f"steps ({k}) must be a multiple of the number of blocks ({blocks} = {n} / {b})")
    _require(k <= n, f"steps ({k}) cannot exceed max_new_tokens ({n}): each step reveals at least one token")
    _require(cfg.remasking in REMASKING, f"unknown remasking {cfg.remasking!r}; choose one of {', '.join(REMASKING)}")
    th = cfg.threshold
    _require(th is None or (isinstance(th, (int, float)) and math.isfinite(th) and 0 < th <= 1),
             f"threshold must be in (0, 1] (got {th!r})")
    _require(cfg.sampler in SAMPLERS, f"unknown sampler {cfg.sampler!r}; choose one of {', '.join(SAMPLERS)}")
    eb = cfg.entropy_bound
    _require(eb is None or (_is_number(eb) and math.isfinite(eb) and eb > 0),
             f"entropy_bound must be a number > 0 (got {eb!r})")
    rb = cfg.revoke_below
    _require(rb is None or (_is_number(rb) and 0 < rb < 1), f"revoke_below must be in (0, 1) (got {rb!r})")
    _require(rb is None or cfg.sampler == "revoke",
             f"revoke_below is the revoke sampler's (sampler is {cfg.sampler!r})")
    _require(isinstance(cfg.no_adjacent_repeat, bool), "no_adjacent_repeat must be true or false")
    ng = cfg.no_repeat_ngram
    _require(isinstance(ng, int) and not isinstance(ng, bool) and (ng == 0 or 2 <= ng <= 8),
             f"no_repeat_ngram must be 0 (off) or a whole number 2..8 (got {ng!r})")

