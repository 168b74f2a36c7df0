"""The decoding controls as one Settings object (their defaults, and the explorer.decode options they mean), and
loading a preset for the app (cached, warmed up, described)."""

from __future__ import annotations

import contextlib
from dataclasses import field, make_dataclass
from typing import Any

import gradio as gr

import explorer
from explorer.app import plots
from explorer.decoding.api import make_config, model_dtype
from explorer.decoding.config import (
    DEFAULT_CACHE,
    METHODS,
    OPTIONS,
    Control,
    DecodeConfig,
    applies,
    option_type,
)
from explorer.decoding.drafters import available_drafters
from explorer.decoding.prompting import validate_prompt
from explorer.errors import ExplorerError
from explorer.models import DEFAULT_PRESET, PRESETS
from explorer.precision import EXACT, parse_preset
from explorer.runtime import Models

# (the page's name, the option's, its Control) for every decode option, in DecodeConfig's order: the sidebar's
# controls, the Settings fields and the /run inputs after prompt, preset and lanes (explorer/app/controls.py)
PAGE = [(o.control.page_name or name, name, o.control) for name, o in OPTIONS.items()]
TOKENS_PER_STEP = tuple(v for _, v in OPTIONS["steps"].control.choices)  # diffusion: N/K, so K follows N
BLOCKS = tuple(v for _, v in OPTIONS["block_length"].control.choices)  # N / block length: it follows N


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


def page_default(name: str, control: Control) -> Any:
    """A control's starting value: its own, else the option's default (None shown as the control's 'off')."""
    if control.default is not None:
        return control.default
    value = getattr(DecodeConfig, name)
    return control.off if value is None else value


def option_value(name: str, control: Control, value: Any) -> Any:
    """A control's value as the option's: 'off' is None, the rest of the option's type (a slider gives 0 for 0.0)."""
    if value is None or (control.off is not None and value == control.off):
        return None
    return option_type(name)(value.strip() if isinstance(value, str) else value)


class _SettingsMethods:
    @classmethod
    def from_values(cls, values: list[Any] | tuple[Any, ...]) -> Any:
        return cls(**dict(zip(SETTING_NAMES, values, strict=True)))

    def as_inputs(self) -> list[Any]:
        """The values in field order, as the UI inputs (and a gradio_client call) take them; inverse of from_values."""
        return [getattr(self, n) for n in SETTING_NAMES]

    @property
    def diffusion(self) -> tuple[int, int]:
        return diffusion_plan(self.max_new_tokens, self.tokens_per_step, self.blocks)  # type: ignore[attr-defined]

    def option_values(self) -> dict[str, Any]:
        """Every option's value as the controls set it, whether or not it acts in a method."""
        values = {name: option_value(name, c, getattr(self, page)) for page, name, c in PAGE}
        values["steps"], values["block_length"] = self.diffusion
        return values

    def options(self, method: str, seed_offset: int = 0) -> dict[str, Any]:
        """explorer.decode keyword options for ``method``: every option that acts in it (config.applies), each
        control's 'off' as None, diffusion's K and block length from their fractions of N."""
        values = self.option_values()
        options = {name: value for name, value in values.items() if applies(name, method, values)}
        options["seed"] = int(self.seed) + seed_offset  # type: ignore[attr-defined]
        return options


# Every decoding control, in the order of the UI inputs (after prompt, preset and lanes): one field per option.
Settings = make_dataclass("Settings", [(page, Any, field(default=page_default(name, c))) for page, name, c in PAGE],
                          bases=(_SettingsMethods,), frozen=True)
Settings.__doc__ = "The page's value of every decode option (lane_settings.PAGE), as one object the handlers take."
SETTING_NAMES = [page for page, _, _ in PAGE]


# The controls a preset sets when it is chosen (page name: the preset's attribute): its drafter and γ, where its
# chain's draft stops, and the diffusion steps, blocks, threshold and sampler its diffusion model was measured with.
PRESET_CONTROLS = {"drafter": "drafter", "gamma": "gamma", "draft_confidence": "draft_confidence",
                   "tokens_per_step": "diffusion_tokens_per_step", "blocks": "diffusion_blocks",
                   "threshold": "diffusion_threshold", "sampler": "diffusion_sampler",
                   "no_adjacent_repeat": "diffusion_no_adjacent_repeat",
                   "no_repeat_ngram": "diffusion_no_repeat_ngram", "cache": "diffusion_cache"}


def _preset_values(preset: Any) -> dict[str, Any]:
    controls = {page: c for page, _, c in PAGE}
    values = {page: getattr(preset, attr) for page, attr in PRESET_CONTROLS.items()}
    values["cache"] = values["cache"] or DEFAULT_CACHE  # the dropdown has no "off"
    return {page: controls[page].off if v is None else v for page, v in values.items()}


def preset_settings(name: str = DEFAULT_PRESET) -> Any:
    """The controls' starting values for a preset (PRESET_CONTROLS), the rest at their defaults."""
    return Settings(**_preset_values(PRESETS[parse_preset(name)[0]]))  # "smollm2-135m@float32": its own settings


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
    """The preset's description, then its values of the PRESET_CONTROLS (the drafter's choices: the drafters it
    can run, its own selected)."""
    models = load_preset(preset, progress)
    drafters = available_drafters(models)
    values = _preset_values(models.preset)
    updates = {page: gr.update(value=v) for page, v in values.items()}
    updates["drafter"] = gr.update(choices=drafters, value=values["drafter"] if values["drafter"] in drafters
                                   else drafters[0])
    return (describe_models(models), *updates.values())


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
            make_config(method, models, settings.options(method), threads=1)  # a check: never measures
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    return methods
