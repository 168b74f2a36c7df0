"""The ``random-tiny`` preset: seeded random miniatures built from a config (tests; no files)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from explorer.families.eagle.files import build_eagle_head
from explorer.runtime import Models, Preset, build_byte_tokenizer, make_bidirectional, register_loader


def build_random_llama(vocab_size: int, hidden: int, layers: int, seed: int, is_causal: bool = True,
                       std: float = 0.2, max_positions: int = 512, eos_id: int | None = None) -> nn.Module:
    """A seeded random LlamaForCausalLM; a large init std keeps its distributions peaked."""
    from transformers import LlamaConfig, LlamaForCausalLM  # deferred: transformers Llama modelling (~2 s to import)

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, initializer_range=std,
                         eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=eos_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if not is_causal:
        config.shift_logits = True
        make_bidirectional(model)
    return model


def load_random(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    tokenizer = build_byte_tokenizer()
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    target = build_random_llama(vocab, 64, 2, seed=1, eos_id=eos).to(device, dtype)
    # The draft is the target plus small noise: aligned enough to accept some drafts.
    draft = copy.deepcopy(target)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p) * 0.02)
    diffusion = build_random_llama(vocab, 64, 2, seed=3, is_causal=False, eos_id=eos).to(device, dtype)
    assistant = build_random_eagle(target, seed=4)
    return Models(preset, tokenizer, target, draft, diffusion, tokenizer, device, dtype, diffusion_shift=True,
                  assistant=assistant, names={"target": "random-tiny/target", "draft": "random-tiny/draft",
                                              "diffusion": "random-tiny/diffusion",
                                              "assistant": "random-tiny/eagle"})


def build_random_eagle(target: nn.Module, seed: int, noise: float = 0.02, kept: torch.Tensor | None = None,
                       fuse_layers: tuple[int, ...] = ()):
    """An EAGLE head built from the target (its last layer) plus seeded noise: a miniature for tests."""
    vocab = target.config.vocab_size
    head = build_eagle_head(target, torch.arange(vocab) if kept is None else kept, fuse_layers)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p) * noise)
    return head.to(target.device, next(target.parameters()).dtype).eval().requires_grad_(False).attach(target)


register_loader("random", load_random)
