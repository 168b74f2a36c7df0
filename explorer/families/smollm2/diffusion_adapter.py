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


def load_diffusion_adapter(path: Path, base: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A bidirectional copy of ``base`` with the adapter merged in; ``base`` itself is untouched.

    A missing or corrupt file raises ExplorerError naming the file.
    """
    from peft import PeftConfig, PeftModel, set_peft_model_state_dict  # deferred: peft (~2.7 s to import)

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
        peft = PeftModel(model, PeftConfig.from_pretrained(str(path)))
        result = set_peft_model_state_dict(peft, load_weights(path / "adapter_model.safetensors"))
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:
            raise KeyError(f"missing {missing[:2]}, unexpected {result.unexpected_keys[:2]}")
        model = peft.merge_and_unload()
    except (ValueError, OSError, RuntimeError, SafetensorError, KeyError) as exc:
        raise ExplorerError(f"diffusion adapter file is corrupt: {path / 'adapter_model.safetensors'} "
                            f"({str(exc).splitlines()[0][:200]})") from None
    return model.to(dtype).eval().requires_grad_(False)
