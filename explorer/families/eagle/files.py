"""The EAGLE head's files (``save_eagle_head`` / ``load_eagle_head``) and its start from the target
(``build_eagle_head``).

On disk: ``config.json`` (the target's Llama config plus ``kept_vocab`` and ``architectures: ["EagleHead"]``) and
``model.safetensors`` (fc, layer, kept ids), compact (int8 rows, the layer matrices that stayed near the target's
last layer as int4 differences from it; ``explorer.compact_weights``) or plain: both load.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from explorer.compact_weights import read_draft_files, save_weights
from explorer.errors import ExplorerError
from explorer.families.eagle.head import EagleHead


def build_eagle_head(target: nn.Module, kept_ids: torch.Tensor, fuse_layers: tuple[int, ...] = ()) -> EagleHead:
    """A head initialised from the target's last layer (its additions to the residual damped); fc
    starts as the identity on the feature half, so the first prediction is about "the same feature".
    ``fuse_layers`` (EAGLE-3) adds the mix of those layers' outputs with the final feature, starting as the final
    feature alone, so a head trained without fusion loads into it unchanged and learns to use the rest."""
    config = copy.deepcopy(target.config)
    if fuse_layers:
        if not all(0 <= i < config.num_hidden_layers - 1 for i in fuse_layers):
            raise ExplorerError(f"fused layers must be in 0 .. {config.num_hidden_layers - 2} (got {fuse_layers})")
        config.fuse_layers = list(fuse_layers)
    head = EagleHead(config, kept_ids)
    if fuse_layers:
        with torch.no_grad():
            h = config.hidden_size
            head.fuse.weight.zero_()
            head.fuse.weight[:, -h:] = torch.eye(h)
    last = target.model.layers[-1]
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(head.layer, name).weight.copy_(getattr(last.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(head.layer, name).weight.copy_(getattr(last.mlp, name).weight)
        head.layer.input_layernorm.weight.copy_(last.input_layernorm.weight)
        head.layer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        head.layer.o_proj.weight.mul_(0.1)  # what the layer adds starts small beside the feature
        head.layer.down_proj.weight.mul_(0.1)
        h = config.hidden_size
        head.fc.weight.mul_(0.1)
        head.fc.weight[:, h:] += torch.eye(h, device=head.fc.weight.device)  # "the feature, plus a little token"
    return head.attach(target)


LAST_LAYER = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
              "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def target_reference(target: nn.Module):
    """``reference(name, state)`` for ``compact_weights``: the target's last-layer matrix the head's layer
    matrix ``name`` was initialised from (``build_eagle_head``); None for the head's own tensors."""
    last = target.model.layers[-1]

    def reference(name: str, state: dict | None = None) -> torch.Tensor | None:
        part, proj, kind = (name.split(".") + ["", ""])[:3]
        if part != "layer" or kind != "weight" or proj not in LAST_LAYER:
            return None
        return getattr(getattr(last, LAST_LAYER[proj]), proj).weight

    return reference


def save_eagle_head(head: EagleHead, out_dir: Path, dtype: torch.dtype | None = None,
                    target: nn.Module | None = None) -> None:
    """Write the head folder: compact weights (``explorer.compact_weights``), or plain in ``dtype`` if given.

    With ``target``, each layer matrix that stayed near the target's last-layer matrix it started from (the
    difference under a third of the weight: q, k, v, gate and up after training here) is stored as its int4
    difference from it; the rest (fc, o and down, which start scaled by 0.1) as int8 rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config.update({"architectures": ["EagleHead"], "kept_vocab": len(head.kept_ids),
                   "embedding": "shared with the target (not stored)", "lm_head": "the target's kept rows"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    state = head.state_dict()
    near = None
    if dtype is None and target is not None:
        ref = target_reference(target)
        near = {n: r for n, t in state.items() if (r := ref(n)) is not None
                and (t.float() - r.float().to(t.device)).norm() < t.float().norm() / 3}
    save_weights(state, out_dir / "model.safetensors", dtype, reference=near)


def load_eagle_head(path: Path, target: nn.Module, dtype: torch.dtype) -> EagleHead:
    """Load a saved head next to its target; a missing, corrupt or mismatched file names the file."""
    from transformers import LlamaConfig  # deferred: transformers Llama modelling (~2 s to import)

    raw, state, weights_file = read_draft_files(path, target_reference(target))
    config = LlamaConfig(**raw)
    if config.vocab_size != target.config.vocab_size or config.hidden_size != target.config.hidden_size \
            or "kept_ids" not in state:
        raise ExplorerError(f"draft file {weights_file} does not match the target (vocabulary "
                            f"{config.vocab_size} vs {target.config.vocab_size}, or no kept_ids)")
    head = EagleHead(config, state["kept_ids"])
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ExplorerError(f"draft file {weights_file} has missing {missing[:3]} or unexpected {unexpected[:3]} "
                            "tensors")
    head = head.to(device=target.device, dtype=dtype).eval().requires_grad_(False)
    return head.attach(target)
