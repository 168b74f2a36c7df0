"""Loading the Gemma 4 family: the ``gemma-4`` preset from the Hub (no remote code: all in transformers 5.23) and
``random-gemma4``, random miniatures of the same three classes (tests)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from explorer.families.gemma.assistant import assistant_kv_sharing_fix
from explorer.runtime import Models, build_byte_tokenizer, require_network

# ----------------------------------------------------------------------------------------------
# random miniatures of the same classes (tests)

def _text_config(cls: type, vocab: int, hidden: int, layers: int, special: dict[str, int], **extra: Any):
    return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16, sliding_window=32,
               max_position_embeddings=512, layer_types=["sliding_attention", "full_attention"] * (layers // 2),
               initializer_range=0.05, **special, **extra)


def build_random_gemma4(tokenizer: Any, seed: int = 0) -> tuple[nn.Module, nn.Module, nn.Module]:
    """A 4-layer Gemma 4 target (per-layer embeddings, last 2 layers reuse the KV of the first 2), a
    2-layer assistant that drafts from its hidden states and shared KV, and a 2-layer mixture-of-experts
    DiffusionGemma (4 experts, canvas of 8)."""
    from transformers import (  # deferred: transformers Gemma 4 modelling (~2 s to import)
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        DiffusionGemmaTextConfig,
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
        Gemma4ForCausalLM,
        Gemma4TextConfig,
        Gemma4VisionConfig,
    )

    vocab = len(tokenizer)
    special = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
               "bos_token_id": tokenizer.bos_token_id}
    torch.manual_seed(seed)
    target = Gemma4ForCausalLM(_text_config(Gemma4TextConfig, vocab, 64, 4, special, num_kv_shared_layers=2,
                                            hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab))
    torch.manual_seed(seed + 1)
    assistant_text = _text_config(Gemma4TextConfig, vocab, 32, 2, special, hidden_size_per_layer_input=0,
                                  vocab_size_per_layer_input=0)
    with assistant_kv_sharing_fix():
        assistant = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=assistant_text,
                                                                     backbone_hidden_size=64))
    with torch.no_grad():  # start it as a "repeat the last token" drafter, so that some drafts are accepted
        assistant.lm_head.weight.copy_(target.get_input_embeddings().weight @ assistant.pre_projection.weight[:, :64].T)
        for layer in assistant.model.layers:  # damp (not remove) what attention and MLP add to the residual
            layer.post_attention_layernorm.weight.mul_(0.1)
            layer.post_feedforward_layernorm.weight.mul_(0.1)
    assistant.generation_config.num_assistant_tokens = 4
    torch.manual_seed(seed + 2)
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=8)
    diffusion = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(
        text_config=_text_config(DiffusionGemmaTextConfig, vocab, 64, 2, special, num_experts=4,
                                 top_k_experts=2, moe_intermediate_size=32), vision_config=vision,
        canvas_length=8, image_token_id=tokenizer.mask_token_id, boi_token_id=None, eoi_token_id=None))
    with torch.no_grad():  # sharper logits: steps accept several positions and the stopping rule can fire
        diffusion.lm_head.weight.mul_(30)
    return target, assistant, diffusion


def load_gemma(preset: Any, device: torch.device, dtype: torch.dtype) -> Models:
    """``random-gemma4`` (built in memory) or ``gemma-4`` (hub ids; no remote code: all in transformers)."""
    from transformers import (  # deferred: transformers Gemma 4 modelling (~2 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
        DiffusionGemmaForBlockDiffusion,
    )

    if preset.target is None:
        tokenizer = build_byte_tokenizer()
        target, assistant, diffusion = (m.to(device, dtype) for m in build_random_gemma4(tokenizer))
        diff_tok, names = tokenizer, {k: f"{preset.name}/{k}" for k in ("target", "draft", "diffusion")}
    else:
        for model_id in (preset.target, preset.draft, preset.diffusion):
            require_network(model_id)
        tokenizer = AutoTokenizer.from_pretrained(preset.target)
        target = AutoModelForCausalLM.from_pretrained(preset.target, dtype=dtype).to(device)
        with assistant_kv_sharing_fix():
            assistant = AutoModelForCausalLM.from_pretrained(preset.draft, dtype=dtype).to(device)
        diff_tok = AutoTokenizer.from_pretrained(preset.diffusion)
        diffusion = DiffusionGemmaForBlockDiffusion.from_pretrained(preset.diffusion, dtype=dtype).to(device)
        names = {"target": preset.target, "draft": preset.draft, "diffusion": preset.diffusion}
    return Models(preset, tokenizer, target, assistant, diffusion, diff_tok, device, dtype, names=names)
