"""A masked-diffusion model shipped as a delta on its autoregressive base.

The Dream / DiffuLLaMA adaptation of a causal LM: the same weights with bidirectional attention,
logits shifted by one (position i predicts token i + 1), a [MASK] token, and a LoRA delta
(``adapter_config.json`` + ``adapter_model.safetensors``, the format of ``peft``, the factors plain or
compact: int8 rows, ``explorer.compact_weights``) trained by
``python -m explorer.train smollm2 diffusion``. ``diffusion_config.json`` names the mask token and
``mask_embedding.safetensors`` holds its trained input embedding.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from explorer.compact_weights import load_weights
from explorer.errors import ExplorerError
from explorer.runtime import make_bidirectional

FILES = ("diffusion_config.json", "adapter_config.json", "adapter_model.safetensors", "mask_embedding.safetensors")


def merge_lora(model: nn.Module, config: dict, weights: dict[str, torch.Tensor]) -> None:
    """Merge a plain LoRA (peft's format: W += B @ A * alpha / r, in place) into ``model``: the bits of peft's
    ``merge_and_unload`` without importing peft (about 2.7 s). A variant this does not state (DoRA, rsLoRA,
    per-module ranks, fan-in-fan-out) is refused, as is a target module left without its pair or a stray key."""
    unsupported = [k for k in ("use_dora", "use_rslora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
                               "layers_to_transform", "modules_to_save") if config.get(k)]
    if config.get("peft_type") != "LORA" or unsupported or config.get("bias", "none") != "none":
        raise KeyError(f"a LoRA variant not supported here ({config.get('peft_type')}, {unsupported})")
    scale = config["lora_alpha"] / config["r"]
    modules = dict(model.named_modules())
    targets = {n for n, m in modules.items() if n.rsplit(".", 1)[-1] in set(config["target_modules"])
               and isinstance(m, nn.Linear)}
    merged = set()
    for key in weights:
        if not key.endswith(".lora_A.weight"):
            if not key.endswith(".lora_B.weight"):
                raise KeyError(f"unexpected {key}")
            continue
        name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        a, b = weights[key], weights[key.replace(".lora_A.", ".lora_B.")]
        weight = modules[name].weight
        with torch.no_grad():
            weight.data += ((b.to(weight.device) @ a.to(weight.device)) * scale).to(weight.dtype)
        merged.add(name)
    if merged != targets:
        raise KeyError(f"missing {sorted(targets - merged)[:2]}, unexpected {sorted(merged - targets)[:2]}")


def load_diffusion_adapter(path: Path, base: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A bidirectional copy of ``base`` with the adapter merged in; ``base`` itself is untouched.

    A missing or corrupt file raises ExplorerError naming the file.
    """
    for name in FILES:
        if not (path / name).exists():
            raise ExplorerError(f"diffusion adapter file missing: {path / name}")
    try:
        meta = json.loads((path / "diffusion_config.json").read_text())
        mask_vec = load_file(str(path / "mask_embedding.safetensors"))["mask_embedding"]
    except (json.JSONDecodeError, SafetensorError, KeyError, OSError) as exc:
        raise ExplorerError(f"diffusion adapter file is corrupt in {path} ({exc})") from None
    model = copy.deepcopy(base).to(torch.float32)
    # Untie the input embedding so the [MASK] row can differ from the output head's row.
    embed = nn.Embedding.from_pretrained(model.get_input_embeddings().weight.detach().clone(), freeze=True)
    embed.weight[meta["mask_token_id"]] = mask_vec.float().to(embed.weight.device)
    model.set_input_embeddings(embed)
    model.config.tie_word_embeddings = False
    make_bidirectional(model)
    model.config.shift_logits, model.config.mask_token_id = True, int(meta["mask_token_id"])
    try:
        merge_lora(model, json.loads((path / "adapter_config.json").read_text()),
                   load_weights(path / "adapter_model.safetensors"))
    except (ValueError, OSError, RuntimeError, SafetensorError, KeyError) as exc:
        raise ExplorerError(f"diffusion adapter file is corrupt: {path / 'adapter_model.safetensors'} "
                            f"({str(exc).splitlines()[0][:200]})") from None
    return model.to(dtype).eval().requires_grad_(False)
