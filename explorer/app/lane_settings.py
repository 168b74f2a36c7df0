"""The decoding controls as one Settings object (their defaults, and the explorer.decode options they mean), and
loading a preset for the app (cached, warmed up, described)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

import gradio as gr

import explorer
from explorer.app import plots
from explorer.decoding.api import make_config, model_dtype
from explorer.decoding.config import DEFAULT_CACHE, METHODS, DecodeConfig, validate_prompt
from explorer.decoding.drafters import available_drafters
from explorer.errors import ExplorerError
from explorer.models import DEFAULT_PRESET, PRESETS, Models
from explorer.precision import EXACT, parse_preset

TOKENS_PER_STEP = (1, 2, 4, 8)  # diffusion: N/K, so K follows N
BLOCKS = (1, 2, 4, 8)  # diffusion: N / block length, so the block length follows N
FLAG_FIELDS = tuple(f.name for f in fields(DecodeConfig) if f.type in ("bool", bool) and f.name != "adaptive_gamma")


# ----------------------------------------------------------------------------------------------
# settings and model loading

def diffusion_plan(max_new_tokens: int, tokens_per_step: int, blocks: int) -> tuple[int, int]:
    """(steps K, block length) that are valid for every N: blocks divide N, K a multiple of the blocks, K <= N."""
    n = max(1, int(max_new_tokens))
    blocks = max(1, min(int(blocks), n))
    while n % blocks:
        blocks -= 1
    block_length = n // blocks
    per_block = max(1, block_length // max(1, int(tokens_per_step)))
    return blocks * per_block, block_length


@dataclass(frozen=True)
class Settings:
    """Every decoding control, in the order of the UI inputs (after prompt, preset and lanes)."""

    max_new_tokens: int = DecodeConfig.max_new_tokens
    temperature: float = DecodeConfig.temperature
    top_p: float = 1.0
    seed: int = DecodeConfig.seed
    drafter: str = DecodeConfig.drafter
    gamma: int = DecodeConfig.gamma
    adaptive_gamma: bool = DecodeConfig.adaptive_gamma
    tokens_per_step: int = 2  # diffusion: N/K
    blocks: int = 4  # diffusion: N / block length
    remasking: str = DecodeConfig.remasking
    threshold: float = 0.0
    cache: str = DEFAULT_CACHE  # diffusion KV cache (and the diffusion drafter's)
    flags: tuple[str, ...] = tuple(name for name in FLAG_FIELDS if getattr(DecodeConfig, name))
    tree: str = ""  # speculative: a token tree ("3,2,1", "dynamic:16"); empty: a chain
    draft_confidence: float = 0.0  # speculative: stop a chain's draft below this probability (0: off)
    sampler: str = DecodeConfig.sampler  # diffusion: which masks a pass reveals (decoding/unmasking.py)
    entropy_bound: float = 0.0  # diffusion, sampler entropy (0: its default)
    revoke_below: float = 0.0  # diffusion, sampler revoke (0: its default)

    @classmethod
    def from_values(cls, values: list[Any] | tuple[Any, ...]) -> Settings:
        kwargs = dict(zip(SETTING_NAMES, values, strict=True))
        kwargs["flags"] = tuple(kwargs.get("flags") or ())
        return cls(**kwargs)

    def as_inputs(self) -> list[Any]:
        """The values in field order, as the UI inputs (and a gradio_client call) take them; inverse of from_values."""
        return [list(v) if isinstance(v, tuple) else v for v in (getattr(self, n) for n in SETTING_NAMES)]

    @property
    def diffusion(self) -> tuple[int, int]:
        return diffusion_plan(self.max_new_tokens, self.tokens_per_step, self.blocks)

    def options(self, method: str, seed_offset: int = 0) -> dict[str, Any]:
        """explorer.decode keyword options for ``method`` (0 means 'off' for top-p 1 and threshold 0)."""
        options: dict[str, Any] = {"max_new_tokens": int(self.max_new_tokens), "temperature": float(self.temperature),
                                   "top_p": None if self.top_p >= 1 else float(self.top_p),
                                   "seed": int(self.seed) + seed_offset}
        options.update({name: name in self.flags for name in FLAG_FIELDS})
        if method == "speculative":
            options.update(gamma=int(self.gamma), drafter=self.drafter, adaptive_gamma=bool(self.adaptive_gamma))
            if (self.tree or "").strip():
                options["tree"] = self.tree.strip()
            else:  # a chain: cut where the draft gets unlikely (given even when off, so the preset's is not used)
                options["draft_confidence"] = float(self.draft_confidence) or None
            if self.drafter == "diffusion":
                options.update(cache=self.cache)
        if method == "diffusion":
            steps, block = self.diffusion
            options.update(steps=steps, block_length=block, remasking=self.remasking,
                           threshold=float(self.threshold) or None, cache=self.cache, sampler=self.sampler,
                           entropy_bound=float(self.entropy_bound) or None if self.sampler == "entropy" else None,
                           revoke_below=float(self.revoke_below) or None if self.sampler == "revoke" else None)
        return options


SETTING_NAMES = [f.name for f in fields(Settings)]
# The decode options the page has no control for, and why (tests/test_setups.py checks that every other
# DecodeConfig field reaches explorer.decode from the page's controls).
NOT_ON_PAGE = {"top_k": "top-p is the page's truncation; top-k is the API's, the CLI's and the Audit tab's",
               "max_ngram": "prompt lookup's n-gram length: the API and CLI",
               "early_exit_layers": "the preset's early exit: the API and CLI",
               "draft_passes": "the diffusion drafter's passes per draft: the API and CLI"}


def preset_settings(name: str = DEFAULT_PRESET) -> Settings:
    """The controls' starting values for a preset: its drafter and γ, and its diffusion steps, blocks and
    threshold."""
    p = PRESETS[parse_preset(name)[0]]  # "smollm2-135m@float32": the preset's own settings
    return Settings(drafter=p.drafter, gamma=p.gamma, tokens_per_step=p.diffusion_tokens_per_step,
                    blocks=p.diffusion_blocks, threshold=p.diffusion_threshold, sampler=p.diffusion_sampler,
                    draft_confidence=p.draft_confidence or 0.0)


_WARMED: set[int] = set()


def load_preset(preset: str, progress: gr.Progress | None = None) -> Models:
    """Load (cached) and warm up a preset; ExplorerError becomes one clear gr.Error."""
    if progress is not None:
        progress(0.05, desc=f"loading preset {preset} (first time only)")
    try:
        models = explorer.load_models(preset)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    if id(models) not in _WARMED:
        if progress is not None:
            progress(0.6, desc="warming up (the first pass of a model is slow; not measured)")
        _warm_up(models)
        _WARMED.add(id(models))
    return models


def _warm_up(models: Models) -> None:
    """A first decode per lane (the first pass of a model is slow) and a first set of figures (plotly loads
    its validators on first use: seconds), so neither lands in a visitor's first run."""
    drafters = available_drafters(models)
    drafter = models.preset.drafter if models.preset.drafter in drafters else "prompt_lookup"
    runs = [("autoregressive", {}), ("speculative", {"drafter": drafter}), ("diffusion", {})]
    traces = {}
    for method, extra in runs:
        with contextlib.suppress(ExplorerError):  # e.g. no diffusion model: that lane will say so when run
            traces[method] = explorer.decode(method, models, "def f(x):", max_new_tokens=4, **extra)
    plots.all_figures(list(traces.values()), traces, models.names)


def describe_models(models: Models) -> str:
    """Markdown: preset, device, dtype, model names, weight memory (the draft's share)."""
    memory = models.memory_bytes()
    mem = ", ".join(f"{role} {size / 2**20:.1f} MiB" for role, size in memory.items())
    share = ""
    if "draft" in memory:
        share = f" (draft = {memory['draft'] / memory['target']:.0%} of the target's weights, plus its KV cache)"
    names = "; ".join(f"{role}: `{name}`" for role, name in models.names.items())
    dtypes = str(models.dtype).replace("torch.", "")
    diffusion_dtype = model_dtype(models.diffusion, models.dtype)  # the target's dtype when there is none
    if getattr(models.diffusion, "kernel_format", None) is None and diffusion_dtype != models.dtype:
        dtypes += f" (diffusion model {str(diffusion_dtype).replace('torch.', '')})"
    precision = ""
    if models.precision is not None:
        exact = "exact: each verify row bit-identical to a one-token pass" if models.precision in EXACT else "torch's"
        precision = f", target precision **{models.precision}** ({exact})"
        if getattr(models.diffusion, "kernel_format", None) is not None:
            precision += f", diffusion model **{models.precision}** on the same kernels"
    if models.precision_choice is not None:
        precision += f" — precision {models.precision_choice.line()}"
    return (f"**Preset `{models.preset.name}`** — {models.preset.description}  \n"
            f"Device **{models.device}**, dtype **{dtypes}**{precision}, batch size 1. "
            f"Models: {names}.  \nWeights: {mem}{share}.")


def describe_preset(preset: str, progress: gr.Progress = gr.Progress()) -> tuple[Any, ...]:  # noqa: B008
    """The preset's description, and its defaults for the controls that depend on it: the drafters it
    can run (its own selected), its γ, the diffusion steps, blocks, threshold and sampler its diffusion model was
    measured with, and where its chain's draft stops."""
    models = load_preset(preset, progress)
    p = models.preset
    drafters = available_drafters(models)
    return (describe_models(models),
            gr.update(choices=drafters, value=p.drafter if p.drafter in drafters else drafters[0]),
            gr.update(value=p.gamma), gr.update(value=p.diffusion_tokens_per_step), gr.update(value=p.diffusion_blocks),
            gr.update(value=p.diffusion_threshold), gr.update(value=p.draft_confidence or 0.0),
            gr.update(value=p.diffusion_sampler))


def lane_tokenizer(models: Models, method: str) -> Any:
    return models.diffusion_tokenizer if method == "diffusion" else models.tokenizer


def check_inputs(models: Models, prompt: str, lanes: list[str], settings: Settings) -> list[str]:
    """Validate every lane before any runs, so bad input gives one message and nothing half-done."""
    methods = [m for m in METHODS if m in (lanes or [])]
    try:
        if not methods:
            raise ExplorerError("choose at least one lane")
        validate_prompt(prompt)
        for method in methods:
            make_config(method, models, settings.options(method))
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    return methods
