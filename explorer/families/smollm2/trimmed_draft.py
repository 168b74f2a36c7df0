"""A draft model with a trimmed LM head (FR-Spec, Zhao et al. 2025).

The draft is a shallow Llama: the target's token embedding (shared, not stored), a few decoder
layers and a final norm, and an LM head over only the ``K`` most frequent target tokens. Its
logits come back over the target's *full* vocabulary with ``-inf`` outside the kept set, so every
decoder treats it as any other draft: after warping, q = 0 there. Exact speculative sampling still
holds: a token with q = 0 is never proposed, and where the target rejects, the residual
norm(max(0, p - q)) equals p on those tokens, so they keep exactly their target probability.
The head costs K x hidden multiply-adds per token instead of V x hidden (8192 vs 49152 for SmolLM2).

On disk (``save_trimmed_draft``): ``config.json`` (a Llama config with the draft's depth and the
target's vocabulary size, plus ``kept_vocab``) and ``model.safetensors`` (layers, norm, head,
kept ids; no embedding), compact or plain: both load. Given the target, the compact form stores each layer
matrix as its int4 difference from the target layer it was copied from, and the head as its difference from
the target's embedding rows of the kept tokens (``explorer.compact_weights``, "differences from a reference"):
about half the bytes of int8 rows, about as close to the trained weights (BENCHMARKS.md, compact weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from explorer.compact_weights import read_draft_files, save_weights
from explorer.errors import ExplorerError


class TrimmedHeadDraft(nn.Module):
    def __init__(self, config, kept_ids: torch.Tensor, embed_tokens: nn.Embedding | None = None):
        from transformers import LlamaModel  # deferred: transformers Llama modelling (~2 s to import)

        super().__init__()
        self.config = config
        self.model = LlamaModel(config)  # (its own embedding is replaced by the target's below)
        if embed_tokens is not None:
            self.model.embed_tokens = embed_tokens
        self.lm_head = nn.Linear(config.hidden_size, len(kept_ids), bias=False)
        self.register_buffer("kept_ids", kept_ids.to(torch.long), persistent=True)  # (K,) target token ids

    @property
    def device(self) -> torch.device:
        return self.kept_ids.device  # a buffer (the head's weight may be a kernel's packed buffer: explorer/precision)

    @property
    def full_vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def trimmed_logits(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False,
                       positions: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """Logits over the kept tokens only: (B, T, K), or (N, K) at ``positions`` (a (N, 2) index)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                         use_cache=use_cache)
        hidden = out.last_hidden_state  # (B, T, H)
        if positions is not None:
            hidden = hidden[positions[:, 0], positions[:, 1]]  # (N, H)
        return self.lm_head(hidden), out.past_key_values

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, logits_to_keep=0,
                **_: object) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                         use_cache=use_cache)
        hidden = out.last_hidden_state  # (B, T, H)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        small = self.lm_head(hidden)  # (B, T, K)
        logits = small.new_full((*small.shape[:-1], self.full_vocab_size), float("-inf"))  # (B, T, V)
        logits[..., self.kept_ids] = small
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values)


def target_reference(target: nn.Module):
    """``reference(name, state)`` for ``compact_weights``: the target tensor a draft tensor was copied from
    (the head: the target's embedding rows of the draft's kept ids); None for the draft's own tensors."""
    own = dict(target.named_parameters())

    def reference(name: str, state: dict[str, torch.Tensor]) -> torch.Tensor | None:
        if name == "lm_head.weight":
            return target.get_input_embeddings().weight[state["kept_ids"].to(target.device)]
        return own.get(name)

    return reference


def save_trimmed_draft(draft: TrimmedHeadDraft, out_dir: Path, dtype: torch.dtype | None = None,
                       target: nn.Module | None = None) -> None:
    """Write the draft folder: compact weights (``explorer.compact_weights``; with ``target``, its matrices as
    int4 differences from the target's), or plain in ``dtype`` if given."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = draft.config.to_dict()
    config.update({"architectures": ["TrimmedHeadDraft"], "kept_vocab": len(draft.kept_ids),
                   "embedding": "shared with the target (not stored)"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v for k, v in draft.state_dict().items() if not k.startswith("model.embed_tokens")}
    matrices = None
    if dtype is None and target is not None:
        ref = target_reference(target)
        matrices = {n: r for n, t in state.items() if t.dim() == 2 and (r := ref(n, state)) is not None}
    save_weights(state, out_dir / "model.safetensors", dtype, bits=4 if matrices is not None else 8,
                 reference=matrices)


def load_trimmed_draft(path: Path, target: nn.Module, dtype: torch.dtype) -> TrimmedHeadDraft:
    """Load a saved draft onto the target's device, sharing the target's embedding.

    A missing, corrupt or mismatched file raises ExplorerError naming the file.
    """
    from transformers import LlamaConfig  # deferred: transformers Llama modelling (~2 s to import)

    raw, state, weights_file = read_draft_files(path, target_reference(target))
    config = LlamaConfig(**raw)
    if config.vocab_size != target.config.vocab_size or "kept_ids" not in state:
        raise ExplorerError(f"draft file {weights_file} does not match the target (vocabulary "
                            f"{config.vocab_size} vs {target.config.vocab_size}, or no kept_ids)")
    with torch.device("meta"):
        draft = TrimmedHeadDraft(config, torch.zeros(len(state["kept_ids"]), dtype=torch.long))  # cpu: meta
    draft.model.embed_tokens = target.get_input_embeddings()
    missing, unexpected = draft.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not k.startswith("model.embed_tokens")]
    if missing or unexpected:
        raise ExplorerError(f"draft file {weights_file} has missing {missing[:3]} or unexpected {unexpected[:3]} "
                            "tensors")
    draft.model.rotary_emb = type(draft.model.rotary_emb)(config=config)  # buffers were on meta
    return draft.to(device=target.device, dtype=dtype).eval().requires_grad_(False)
