"""The public API: ``decode`` runs a method to completion, ``stream`` yields its events."""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import torch

from explorer.decoding.autoregressive import decode_autoregressive
from explorer.decoding.config import DecodeConfig, parse_tree, validate
from explorer.decoding.diffusion import decode_diffusion
from explorer.decoding.events import DecodeResult, Event, Trace
from explorer.decoding.prompting import (
    encode_prompt,  # noqa: F401  (its home is prompting.py)
    validate_prompt,
)
from explorer.decoding.speculative import decode_speculative
from explorer.errors import ExplorerError
from explorer.precision.choice import speculative_defaults
from explorer.runtime import Models

DECODERS = {"autoregressive": decode_autoregressive, "speculative": decode_speculative,
            "diffusion": decode_diffusion}


def make_config(method: str, models: Models, options: dict[str, Any], threads: int | None = None) -> DecodeConfig:
    """The DecodeConfig of ``options``, validated, with the preset's defaults filled in; a speculative decode's γ and
    draft cut are those measured on this machine at ``threads`` torch threads (None: the current count), the first
    such decode measuring them (precision.choice.speculative_defaults)."""
    known = set(DecodeConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ExplorerError(f"unknown option(s): {', '.join(unknown)}")
    options = {k: v for k, v in options.items()
               if v is not None or k in ("top_k", "top_p", "threshold", "draft_confidence")}
    gamma, cut = models.preset.gamma, models.preset.draft_confidence
    if method == "speculative" and not {"gamma", "draft_confidence"} <= set(options):
        measured = speculative_defaults(models, torch.get_num_threads() if threads is None else threads)
        gamma, cut = (measured.gamma, measured.draft_confidence) if measured is not None else (gamma, cut)
    if method == "speculative" and not {"gamma", "draft_confidence"} & set(options) and not options.get(
            "tree") and options.get("drafter", models.preset.drafter) == models.preset.drafter:
        options["draft_confidence"] = cut  # the preset's chain: its γ is the longest
    if method == "speculative" and "gamma" not in options:
        options["gamma"] = gamma
    if method == "speculative" and "drafter" not in options:
        options["drafter"] = models.preset.drafter
    cfg = DecodeConfig(**options)
    validate(method, cfg)
    return cfg


def stream(method: str, models: Models, prompt: str, **options: Any) -> Generator[Event, None, Trace]:
    """Yield every event of one decode as it happens; the generator returns the Trace."""
    cfg = make_config(method, models, options)  # validates the method and every option
    prompt = validate_prompt(prompt)
    tokenizer = models.diffusion_tokenizer if method == "diffusion" else models.tokenizer
    prompt_ids, prompt_format = encode_prompt(tokenizer, prompt, models.preset.chat)
    if not prompt_ids:
        raise ExplorerError("the prompt encodes to no tokens")
    model = models.diffusion if method == "diffusion" else models.target
    context = models.context_length if model is None else int(
        getattr(model.config, "max_position_embeddings", None) or models.context_length)
    headroom = cfg.gamma + 1 if method == "speculative" else 0  # a verify pass may run gamma + 1 past the output
    tree = parse_tree(cfg.tree) if method == "speculative" else None
    if tree is not None:  # a tree's verify pass holds every node at once
        headroom = tree.max_nodes + 1
        if len(prompt_ids) + cfg.max_new_tokens + headroom > context:
            raise ExplorerError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) + the "
                                f"tree's {tree.max_nodes} nodes exceed the model's context of {context} tokens")
    if len(prompt_ids) + cfg.max_new_tokens + headroom > context:
        raise ExplorerError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) "
                            f"exceeds the model's context of {context} tokens")
    events: list[Event] = []
    decoder = DECODERS[method](models, prompt_ids, cfg)
    try:
        while True:
            event = next(decoder)
            events.append(event)
            yield event
    except StopIteration as stop:
        result = stop.value
    return build_trace(method, models, prompt, prompt_ids, prompt_format, cfg, events, result)


def decode(method: str, models: Models, prompt: str, **options: Any) -> Trace:
    """Run one decode to completion and return its Trace (options: config.DecodeConfig, config.OPTION_HELP)."""
    gen = stream(method, models, prompt, **options)
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


def model_dtype(model: Any, default: torch.dtype) -> torch.dtype:
    """The dtype a decoder's model computes in (the smollm2 preset's diffusion model may be bf16 beside an fp32
    target)."""
    param = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
    return param.dtype if param is not None else default


def precision_of(method: str, models: Models) -> str:
    """The precision a lane ran in: the target's (explorer/precision; the diffusion model's too where it runs on
    the same kernels) or, on the dtype path, its model's dtype."""
    on_kernels = method != "diffusion" or getattr(models.diffusion, "kernel_format", None) is not None
    if on_kernels and models.precision is not None:
        return models.precision
    return str(model_dtype(models.diffusion if method == "diffusion" else models.target, models.dtype)).replace(
        "torch.", "")


def build_trace(method: str, models: Models, prompt: str, prompt_ids: list[int], prompt_format: str,
                cfg: DecodeConfig, events: list[Event], result: DecodeResult) -> Trace:
    """The decoder's DecodeResult and events -> the Trace every view and measurement reads."""
    wall = time.perf_counter() - result.t0
    tokens = result.tokens
    tokenizer = models.diffusion_tokenizer if method == "diffusion" else models.tokenizer
    passes = result.target_passes
    stats = {
        "method": method,
        "preset": models.preset.name,
        "device": str(models.device),
        "dtype": str(model_dtype(models.diffusion if method == "diffusion" else models.target, models.dtype))
        .replace("torch.", ""),
        "precision": precision_of(method, models),
        "precision_choice": models.precision_choice.line() if models.precision_choice is not None else None,
        "batch_size": 1,
        "prompt_tokens": len(prompt_ids),
        "prompt_format": prompt_format,
        "new_tokens": len(tokens),
        "target_forward_passes": passes,
        "draft_forward_passes": result.draft_passes,
        "proposed": result.proposed,
        "accepted": result.accepted,
        "acceptance_rate": result.accepted / result.proposed if result.proposed else None,
        "tokens_per_target_pass": len(tokens) / passes if passes else None,
        "wall_s": wall,
        "ttft_s": result.times[0] if result.times else None,
        "target_forward_s": result.target_forward_s,
        "draft_forward_s": result.draft_forward_s,
        "tokens_per_s": len(tokens) / wall if wall > 0 else None,
    }
    if method == "speculative":
        measured = speculative_defaults(models, torch.get_num_threads())  # read back: measured by make_config
        ran = measured is not None and (cfg.gamma, cfg.draft_confidence, cfg.drafter, cfg.tree) == (
            measured.gamma, measured.draft_confidence, models.preset.drafter, None)
        stats["speculative_default"] = measured.line() if ran else None  # None: the request chose its own
        stats["drafter"] = cfg.drafter
        stats["gamma"] = cfg.gamma
        stats["per_position_acceptance"] = [a / n for a, n in result.per_position]
        stats["tree"] = cfg.tree or None  # None: a chain; per_position_acceptance is then per tree depth
    if method == "speculative" and cfg.drafter == "diffusion":
        stats["draft_passes_per_proposal"] = cfg.draft_passes
    if method == "diffusion":  # steps is the budget K; with a threshold the passes made are fewer
        fed = result.fed_tokens
        stats.update(steps=cfg.diffusion_steps, block_length=cfg.diffusion_block_length,
                     remasking=cfg.remasking, threshold=cfg.threshold, denoiser_passes=passes, cache=result.cache,
                     fed_tokens_per_pass=fed / passes if passes and fed is not None else None)
    if method == "diffusion" and models.diffusion_tokenizer is not models.tokenizer:
        stats["note"] = "the diffusion side uses a different model and tokenizer than the target"
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    config = {"method": method, "preset": models.preset.name, **cfg.as_dict()}
    if method == "diffusion":
        config["cache"] = result.cache  # the cache used (the option may be None: the default)
    return Trace(method, prompt, prompt_ids, tokens, text, stats, events, config, result.t0, result.times)
