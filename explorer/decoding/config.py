"""Decoding options: one dataclass with defaults, validated in one place (``validate``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from explorer.decoding.unmasking import DEFAULT_SAMPLER, SAMPLERS
from explorer.errors import ExplorerError

METHODS = ("autoregressive", "speculative", "diffusion")
DRAFTERS = ("model", "prompt_lookup", "early_exit", "diffusion", "assistant")
REMASKING = ("low_confidence", "random")
CACHES = ("none", "prefix", "dual")  # diffusion KV cache (Fast-dLLM, Wu et al. 2025, Sec. 3.1)
# The cache when the option is None, wherever the model takes a KV cache: "dual", the measured choice (2.1x at
# N = 128 on tiny and 2.75x at N = 64 on smollm2-135m, perplexity unchanged: BENCHMARKS.md, diffusion KV cache).
DEFAULT_CACHE = "dual"
SWEEP_CACHE = "dual"  # what the break-even sweep decodes with
MAX_PROMPT_CHARS = 20_000
TREE_DRAFTERS = ("model", "early_exit", "assistant")  # the drafters that give a distribution per tree node
MAX_TREE_NODES, MAX_TREE_DEPTH = 256, 32


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    # speculative
    gamma: int = 4
    drafter: str = "model"
    adaptive_gamma: bool = False
    max_ngram: int = 3  # prompt lookup
    early_exit_layers: int | None = None
    draft_passes: int = 1  # diffusion drafter: denoiser passes per proposal
    draft_confidence: float | None = None  # stop a chain's draft once its probability under the drafter is below
    # diffusion
    steps: int | None = None  # default: max_new_tokens (one token revealed per pass)
    block_length: int | None = None  # default: max_new_tokens (one block)
    remasking: str = "low_confidence"
    threshold: float | None = None
    sampler: str = DEFAULT_SAMPLER  # which positions a pass reveals (and re-masks): decoding/unmasking.py
    entropy_bound: float | None = None  # sampler "entropy" (and DiffusionGemma's sampler)
    revoke_below: float | None = None  # sampler "revoke"
    cache: str | None = None  # none | prefix | dual; None: DEFAULT_CACHE where the model takes a KV cache
    # speculative token tree: None or "" = a chain of gamma drafts; "3,2,1" branching per depth; "dynamic:16"
    tree: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def diffusion_steps(self) -> int:
        return self.steps if self.steps is not None else self.max_new_tokens

    @property
    def diffusion_block_length(self) -> int:
        return self.block_length if self.block_length is not None else self.max_new_tokens


# One sentence per option: the CLI's --help, the bench's flags and docs/design.md read these.
OPTION_HELP = {
    "max_new_tokens": "tokens to generate (N)",
    "temperature": "0 = greedy; target and draft are warped alike by temperature, top-k, top-p",
    "top_k": "sample among the k most likely tokens only (default: off)",
    "top_p": "sample among the smallest set of tokens whose probability reaches top_p, in (0, 1] (default: off)",
    "seed": "seed of the one sampling generator a decode uses",
    "gamma": "speculative: tokens drafted per step, 1..64 (default: the preset's)",
    "drafter": f"speculative: {', '.join(DRAFTERS)} (default: the preset's)",
    "adaptive_gamma": "speculative: gamma +2 after a full acceptance, -1 after a rejection (up to 16)",
    "max_ngram": "prompt_lookup drafter: the longest n-gram it matches",
    "early_exit_layers": "early_exit drafter: target layers it runs (default: the preset's, else a third)",
    "draft_passes": "diffusion drafter: denoiser passes per draft",
    "draft_confidence": "speculative: stop a chain's draft once the product of the drafter's probabilities of its "
                        "tokens (untempered softmax; EAGLE-2's value of a draft) falls below this, in (0, 1]; gamma "
                        "is then the longest draft; drafters model, early_exit, assistant (default: off)",
    "steps": "diffusion: denoiser passes K, a multiple of the number of blocks, <= N (default: N)",
    "block_length": "diffusion: block length, divides N; blocks are filled left to right (default: N)",
    "remasking": f"diffusion: which predictions a pass keeps: {', '.join(REMASKING)}",
    "threshold": "diffusion: also reveal every position above this confidence, in (0, 1] (Fast-dLLM; default: off)",
    "sampler": f"diffusion: which masked positions a pass reveals: {', '.join(SAMPLERS)} (confidence: the most "
               "confident, or all above the threshold; entropy: lowest entropy first within entropy_bound "
               "(EB-sampler); dilated: as confidence, never two neighbours in one pass; revoke: as confidence, and "
               "tokens whose probability falls below revoke_below are masked again (WINO))",
    "entropy_bound": "diffusion, sampler entropy (and DiffusionGemma): the bound on a pass's summed entropy in nats, "
                     "> 0 (default: 0.5; DiffusionGemma's own)",
    "revoke_below": "diffusion, sampler revoke: re-mask a committed token whose probability falls below this, in "
                    "(0, 1) (default: 0.3)",
    "tree": "speculative: draft a token tree instead of a chain: '3,2,1' = children per depth, 'dynamic:16' = "
            "best-first by cumulative draft probability up to 16 nodes (drafters model, early_exit; default: chain)",
    "cache": f"diffusion KV cache: {', '.join(CACHES)} (default: {DEFAULT_CACHE!r} where the model takes one)",
}


# What a decode's setup is: every option its output distribution or its cost depends on, per method. Measure's rows,
# the latency plot's series, the run history's pooled speedups and the bench's labels all key on ``setup_label``,
# so two decodes that differ in any of these are never pooled. Not in a setup: ``seed`` (it picks a sample, not the
# distribution); every other DecodeConfig field is in at least one method's list (tests/test_setups.py).
COMMON_SETUP = ("temperature", "top_k", "top_p", "max_new_tokens")
SETUP_OPTIONS = {
    "autoregressive": COMMON_SETUP,
    "speculative": ("drafter", "gamma", "draft_confidence", "tree", "adaptive_gamma", "max_ngram", "early_exit_layers",
                    "draft_passes") + COMMON_SETUP,
    "diffusion": ("sampler", "steps", "block_length", "remasking", "threshold", "entropy_bound", "revoke_below",
                  "cache") + COMMON_SETUP,
}
NOT_SETUP = ("seed",)
# how a setup label names an option (the rest by their own name)
SETUP_NAMES = {"max_new_tokens": "N", "temperature": "T", "gamma": "γ", "draft_confidence": "cut", "steps": "K",
               "block_length": "block", "top_k": "top-k", "top_p": "top-p"}
ALWAYS_SHOWN = ("max_new_tokens", "temperature", "drafter", "gamma", "sampler", "steps", "block_length")


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


def validate_prompt(prompt: Any) -> str:
    """Text only: not empty, bounded, valid UTF-8, no control characters but tab and newlines."""
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError:
            raise ExplorerError("the prompt is not valid UTF-8 text") from None
    _require(isinstance(prompt, str), "the prompt must be text")
    _require(prompt.strip() != "", "the prompt is empty")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ExplorerError("the prompt is not valid UTF-8 text (it holds lone surrogates)") from None
    bad = next((c for c in prompt if (ord(c) < 32 and c not in "\t\n\r") or 0x7F <= ord(c) < 0xA0), None)
    _require(bad is None, f"the prompt contains a control character (U+{ord(bad or ' '):04X}); remove it")
    _require(len(prompt) <= MAX_PROMPT_CHARS, f"the prompt is too long ({len(prompt)} characters; "
             f"the limit is {MAX_PROMPT_CHARS})")
    return prompt
