"""What every layer shares, importing nothing else of the explorer but its errors: the preset record, the loaded
bundle (``Models``), timed and synchronized forward passes, the checks and model surgery the families and decoders
use, and the registry of loaders that model families fill (``register_loader``).

``explorer.models`` (presets and ``load_models``) sits above the families; the decoders and families import
from here, so no module of the explorer imports another in a circle (tests/test_imports.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from torch import nn
from transformers import PreTrainedTokenizerFast

from explorer.errors import ExplorerError

ASSETS = Path(__file__).resolve().parent.parent / "assets"  # the models and prompts that ship with the project


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str  # "random" | "local" | "gguf" | "hub" | "gemma-hub" | "gemma-random" (explorer/families/gemma)
    description: str
    target: str | None = None
    draft: str | None = None
    diffusion: str | None = None
    chat: bool = False  # apply the tokenizer's chat template to prompts
    gamma: int = 4
    # a chain's draft stops once its probability under the drafter falls below this (None: always gamma drafts);
    # applies where a decode names neither gamma nor draft_confidence nor a tree, and drafts with the preset's drafter
    draft_confidence: float | None = None
    early_exit_layers: int | None = None
    diffusion_from: str | None = None  # another preset whose diffusion model (and tokenizer) is borrowed
    assistant: str | None = None  # a drafter that reads the target's hidden states (an EAGLE head)
    drafter: str = "model"  # the drafter used when none is named
    # the app's diffusion defaults: tokens revealed per pass (N/K) and blocks (N / block length)
    diffusion_tokens_per_step: int = 2
    diffusion_blocks: int = 4
    diffusion_threshold: float = 0.0  # and Fast-dLLM's confidence threshold (0: off)
    diffusion_sampler: str = "confidence"  # the lane's sampler (decoding/unmasking.py)
    diffusion_no_adjacent_repeat: bool = False  # and whether it bans a neighbour's token
    diffusion_no_repeat_ngram: int = 0  # and the n of the n-grams it never repeats (0: off)
    diffusion_cache: str | None = None  # and its KV cache (None: decoding.config.DEFAULT_CACHE)
    # the diffusion model in bfloat16 on a CPU with native bf16 (AVX512-BF16 / AMX) when no dtype is asked for:
    # its passes over a whole block are compute-bound there and bf16 halves them (measured in the model card)
    diffusion_bf16_on_cpu: bool = False
    # on a CPU with no dtype or precision asked for, the target in the fastest exact precision (explorer/precision)
    exact_on_cpu: bool = False


@dataclass
class Models:
    """The loaded bundle. ``diffusion_tokenizer`` is ``tokenizer`` unless the sides differ."""

    preset: Preset
    tokenizer: Any
    target: nn.Module
    draft: nn.Module | None
    diffusion: nn.Module | None
    diffusion_tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    diffusion_shift: bool = False  # logits at i predict token i+1 (Dream, adapted AR models)
    names: dict[str, str] = field(default_factory=dict)
    assistant: nn.Module | None = None  # drafts from the target's hidden states (explorer/families/eagle/head.py)
    precision: str | None = None  # explorer/precision: "int8", "float32-exact", ...; None: the dtype's torch path
    precision_choice: Any = None  # explorer/precision/choice.PrecisionChoice where the precision was measured
    speculative_choice: Any = None  # choice.SpeculativeChoice where the preset's γ and cut were measured here
    speculative_by_threads: dict[int, Any] = field(default_factory=dict)  # the same at other thread counts

    @property
    def mask_token_id(self) -> int | None:
        tok_id = getattr(self.diffusion_tokenizer, "mask_token_id", None)
        if tok_id is None and self.diffusion is not None:
            tok_id = getattr(self.diffusion.config, "mask_token_id", None)
        return tok_id

    @property
    def context_length(self) -> int:
        return context_length(self.target.config)

    def memory_bytes(self) -> dict[str, int]:
        """Weight bytes per model; a draft's tensors shared with the target (a trimmed-head draft's
        embedding, an early exit's layers) count for the target only. An EAGLE head counts its own
        weights and the copy of the target's LM-head rows it keeps."""
        shared = {p.data_ptr() for p in self.target.parameters()}
        sizes = {name: weight_bytes(m, exclude=set() if name == "target" else shared) for name, m in
                 [("target", self.target), ("draft", self.draft), ("diffusion", self.diffusion)] if m is not None}
        if self.assistant is not None:
            sizes["assistant"] = (self.assistant.head_bytes() if hasattr(self.assistant, "head_bytes")
                                  else weight_bytes(self.assistant, exclude=shared))
        return sizes


def context_length(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", None) or 2048)


def weight_bytes(model: nn.Module, exclude: set[int] | None = None) -> int:
    seen, total = set(exclude or ()), 0
    for p in [*model.parameters(), *model.buffers()]:  # an exact precision keeps its weights as buffers
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


# ----------------------------------------------------------------------------------------------
# loaders by preset kind: each family registers its own (``explorer/families/<family>/__init__.py``)

Loader = Callable[[Preset, torch.device, torch.dtype], "Models"]
LOADERS: dict[str, Loader] = {}


def register_loader(kind: str, loader: Loader) -> None:
    """Presets of ``kind`` are loaded by ``loader(preset, device, dtype) -> Models``."""
    if kind in LOADERS and LOADERS[kind] is not loader:
        raise ValueError(f"two loaders for preset kind {kind!r}")
    LOADERS[kind] = loader


# ----------------------------------------------------------------------------------------------
# forward passes, checks and surgery

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward(model: nn.Module, input_ids: torch.Tensor, cache: Any = None,
                  keep: int | torch.Tensor | None = None, **extra: Any) -> tuple[torch.Tensor, float]:
    """One forward pass, synchronized before and after; returns logits (1, T, V) and seconds.

    ``keep``: compute the LM head for the last ``keep`` positions only (a prefill needs one row),
    or for the row indices in a tensor. ``extra`` goes to the model (e.g. ``position_ids``).
    """
    device = input_ids.device
    kwargs: dict[str, Any] = {"past_key_values": cache, "use_cache": True} if cache is not None else {}
    kwargs.update(extra)
    if keep is not None:
        kwargs["logits_to_keep"] = keep
    synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        logits = model(input_ids=input_ids, **kwargs).logits
    synchronize(device)
    return logits, time.perf_counter() - start


def output_vocab_size(model: nn.Module) -> int:
    """The size of the distribution a model's logits cover (a trimmed-head draft still covers all)."""
    return int(getattr(model, "full_vocab_size", 0) or model.get_output_embeddings().weight.shape[0])


def check_same_vocabulary(target: nn.Module, draft: nn.Module | None) -> None:
    """A draft must score the target's tokens: same output vocabulary size."""
    if draft is None:
        return
    vt, vd = output_vocab_size(target), output_vocab_size(draft)
    if vt != vd:
        raise ExplorerError(f"the draft's vocabulary ({vd} tokens) differs from the target's ({vt}); "
                            "a draft model must share the target's tokenizer")


def make_bidirectional(model: nn.Module) -> nn.Module:
    """Turn a decoder into a bidirectional denoiser (Dream / DiffuLLaMA adaptation).

    ``config.is_causal = False`` makes transformers build a full mask, but the attention
    modules carry their own ``is_causal`` flag that SDPA falls back to: clear both.
    """
    model.config.is_causal = False
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
    return model


def require_network(model_id: str) -> None:
    """Fail fast, with one clear line, when a hub model is neither cached nor reachable."""
    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    try:
        if offline:
            raise OSError("HF_HUB_OFFLINE is set")
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError as exc:
        raise ExplorerError(f"{model_id} is not in the local cache and the Hugging Face Hub is unreachable "
                            f"({exc}); hub presets need network (and a GPU). Use preset 'tiny' offline.") from None


def build_byte_tokenizer():
    """A byte-level tokenizer with no merges: 256 byte tokens + eos, pad, mask."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|pad|>", "<|mask|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|pad|>", mask_token="<|mask|>")
