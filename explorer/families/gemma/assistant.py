"""Gemma 4's assistant (``Gemma4AssistantForCausalLM``): a drafter that reads the target's hidden states and
shared KV from the verify pass (``AssistantDrafter``, drafter kind ``"assistant"``).

The rule is transformers' own, restated so every step can be animated:
``SinglePositionMultiTokenCandidateGenerator`` (generation/candidate_generator.py). tests/test_gemma.py checks
it against that reference on ``random-gemma4``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from explorer.decoding.config import DecodeConfig
from explorer.decoding.draft import Draft
from explorer.decoding.sampling import sample, token_probability, warp_logits
from explorer.errors import ExplorerError
from explorer.runtime import Models, synchronize


@contextlib.contextmanager
def assistant_kv_sharing_fix():
    """Let a Gemma 4 assistant be built (from a config or ``from_pretrained``) in transformers 5.23.0.

    An assistant's config must share the KV of *all* its layers (``Gemma4AssistantConfig`` sets
    ``num_kv_shared_layers = num_hidden_layers`` and ``validate_architecture`` insists on it), but
    ``Gemma4TextConfig.kv_sharing_modes`` then raises "The set of layer types producing a cache is
    different than the set of layer types using them", because no layer of the assistant produces
    KV: the target's "store" layers do. So ``Gemma4AssistantForCausalLM(config)`` fails for every valid
    config. The property is read only while the layers are constructed; during construction this
    answers "reuse" for every layer of a fully shared config (what the assistant's forward expects:
    no k/v projections, KV from ``shared_kv_states``) and defers to transformers otherwise.
    """
    from transformers import Gemma4TextConfig  # deferred: transformers Gemma 4 modelling (~2 s to import)

    original = Gemma4TextConfig.kv_sharing_modes

    def modes(config):
        if config.num_kv_shared_layers and config.num_kv_shared_layers == config.num_hidden_layers:
            return ["reuse"] * config.num_hidden_layers
        return original.fget(config)

    with _PATCH_LOCK:
        Gemma4TextConfig.kv_sharing_modes = property(modes)
        try:
            yield
        finally:
            Gemma4TextConfig.kv_sharing_modes = original


_PATCH_LOCK = threading.Lock()


def is_assistant(model: nn.Module | None) -> bool:
    return model is not None and type(model).__name__.startswith(("Gemma4Assistant", "Gemma4UnifiedAssistant"))


# ----------------------------------------------------------------------------------------------
# the assistant drafter

@dataclass
class AssistantDrafter:
    """Gemma 4 assistant: drafts from one position, fed [embedding(last token) ⊕ target hidden state].

    It has no KV cache of its own: it cross-attends to the KV the target's "store" layers produced in
    the verify pass, which it captures with two one-shot hooks armed in ``propose`` (so the speculative
    loop is unchanged). As in transformers, the first step drafts nothing (the prefill is the verify
    pass that produces the first hidden state), the assistant's position id stays at the last token's
    position while it drafts, and the shared KV is cut to the current length. That cut is transformers'
    rule, kept for parity: after a rejection the last entry it keeps is the KV of the rejected draft (at the
    position of the token that replaced it); after a full acceptance there is no entry at that position.
    """

    drafts_after_prefill: ClassVar[bool] = True  # it reads the prefill's hidden states: nothing to draft before

    target: nn.Module
    assistant: nn.Module
    eos_id: int | None
    name: str = "assistant"
    captured: Any = None  # the target's outputs in the last verify pass
    fed_from: int = 0  # position of the first token that pass was fed (its cache length before it)
    hooks: list = field(default_factory=list)

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, gen: torch.Generator):
        # The hidden state of the position before the last token (the one that predicted it).
        outputs, index = self.captured, len(tokens) - 2 - self.fed_from
        self._arm()
        if outputs is None or gamma < 1:
            return Draft([], None)
        device = self.assistant.device
        length = len(tokens)
        shared = {k: (v[0][:, :, :length], v[1][:, :, :length]) for k, v in outputs.shared_kv_states.items()}
        hidden = outputs.hidden_states[-1][:, index:index + 1]
        position = torch.tensor([[length - 1]], device=device)
        embed = self.target.get_input_embeddings()
        token = tokens[-1]
        drafted, rows, seconds, sure = [], [], 0.0, 1.0
        for _ in range(gamma):
            synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode():
                inputs = torch.cat([embed(torch.tensor([[token]], device=device)), hidden], dim=-1)
                out = self.assistant(inputs_embeds=inputs, position_ids=position, shared_kv_states=shared)
            synchronize(device)
            seconds += time.perf_counter() - start
            q = warp_logits(out.logits[0, -1], cfg.temperature, cfg.top_k, cfg.top_p)
            token = sample(q, gen)
            drafted.append(token)
            rows.append(q)
            hidden = out.last_hidden_state
            if cfg.draft_confidence is not None:  # stop where the draft's value (EAGLE-2) falls below it
                sure *= token_probability(out.logits[0, -1], token)
            if token == self.eos_id or sure < (cfg.draft_confidence or 0.0):
                break
        return Draft(drafted, torch.stack(rows), seconds, len(drafted))

    def _arm(self) -> None:
        """Ask this thread's next target forward (the verify pass) for hidden states and shared KV, and keep them
        (another thread's decode on the same target, e.g. a lane decoded beside this one, is left alone)."""
        self._disarm()
        owner = threading.get_ident()

        def pre(module, args, kwargs):
            if threading.get_ident() != owner:
                return None
            cache = kwargs.get("past_key_values")
            self.fed_from = cache.get_seq_length() if cache is not None else 0
            return args, {**kwargs, "output_hidden_states": True, "return_shared_kv_states": True}

        def post(module, args, kwargs, output):
            if threading.get_ident() == owner:
                self.captured = output
                self._disarm()

        self.hooks = [self.target.register_forward_pre_hook(pre, with_kwargs=True),
                      self.target.register_forward_hook(post, with_kwargs=True)]

    def _disarm(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []

    def rollback(self, keep: int) -> None:
        pass  # nothing cached: the next proposal reads the verify pass's outputs up to the current length

    @property
    def cache_len(self) -> None:
        return None


def make_assistant_drafter(models: Models) -> AssistantDrafter:
    if not is_assistant(models.draft):
        raise ExplorerError(f"preset {models.preset.name!r} has no drafter that reads the target's hidden "
                            "states (a Gemma 4 assistant or an EAGLE head); drafter 'assistant' needs one "
                            "(presets 'smollm2-135m', 'gemma-4')")
    if not type(models.target).__name__.startswith(("Gemma4", "Gemma3n")):
        raise ExplorerError("drafter 'assistant' needs a Gemma 4 target (it reads the target's shared KV)")
    return AssistantDrafter(models.target, models.draft, models.tokenizer.eos_token_id)
