"""The embedded ``tiny`` preset: a Llama target, its distilled draft and a diffusion model, all trained here on
Python standard-library code (assets/models/tiny; ``python -m explorer.train`` rebuilds them)."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from explorer.compact_weights import from_pretrained
from explorer.errors import ExplorerError
from explorer.runtime import ASSETS, Models, Preset, make_bidirectional

TINY_DIR = ASSETS / "models" / "tiny"


def load_tiny(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    root = TINY_DIR
    if not (root / preset.target / "config.json").exists():
        raise ExplorerError(f"embedded models missing in {root}; rebuild them with `python -m explorer.train`")

    def load(sub: str | None) -> nn.Module | None:
        if sub is None:
            return None
        return from_pretrained(AutoModelForCausalLM, root / sub, dtype).to(device)

    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    diffusion, _ = load_tiny_diffusion(device, dtype)
    return Models(preset, tokenizer, load(preset.target), load(preset.draft), diffusion, tokenizer, device, dtype,
                  diffusion_shift=bool(getattr(diffusion.config, "shift_logits", False)),
                  names={"target": "tiny/target", "draft": "tiny/draft", "diffusion": "tiny/diffusion"})


def load_tiny_diffusion(device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoTokenizer,
    )

    path = TINY_DIR / "diffusion"
    config = json.loads((path / "config.json").read_text())
    auto = AutoModelForCausalLM if config.get("shift_logits") else AutoModelForMaskedLM
    model = from_pretrained(auto, path, dtype).to(device)
    if config.get("is_causal") is False:
        make_bidirectional(model)
    return model, AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")
