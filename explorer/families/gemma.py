"""The Gemma 4 family, all native to transformers 5.23 (no remote code):

- a Gemma 4 target (``Gemma4ForCausalLM`` / ``Gemma4ForConditionalGeneration``);
- its assistant (``Gemma4AssistantForCausalLM``), a drafter that reads the target's hidden states and
  shared KV from the verify pass (``AssistantDrafter``, drafter kind ``"assistant"``);
- ``DiffusionGemmaForBlockDiffusion``: block diffusion over canvases with an encoder KV cache and the
  entropy-bound sampler (``decode_diffusion_gemma``).

The rules are transformers' own, restated here so every step can be animated:
``SinglePositionMultiTokenCandidateGenerator`` (generation/candidate_generator.py) for the assistant and
``DiffusionGemmaGenerationMixin.generate`` (models/diffusion_gemma/generation_diffusion_gemma.py) for the
diffusion lane. tests/test_gemma.py checks both against those references on ``random-gemma4``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import DynamicCache

from explorer.decoding.config import DecodeConfig
from explorer.decoding.events import DecodeResult, Event, RefinementStep
from explorer.decoding.sampling import sample, warp_logits
from explorer.errors import ExplorerError
from explorer.models import Models, synchronize

# Defaults of DiffusionGemmaGenerationConfig._get_default_generation_params (used when a checkpoint sets none).
DIFFUSION_DEFAULTS = {"max_denoising_steps": 48, "entropy_bound": 0.1, "t_min": 0.4, "t_max": 0.8,
                      "stability_threshold": 1, "confidence_threshold": 0.005}


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
    from transformers import Gemma4TextConfig

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


def is_diffusion_gemma(model: nn.Module | None) -> bool:
    return type(model).__name__ == "DiffusionGemmaForBlockDiffusion"


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
        from explorer.decoding.drafters import Draft

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
        drafted, rows, seconds = [], [], 0.0
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
            if token == self.eos_id:
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


# ----------------------------------------------------------------------------------------------
# DiffusionGemma: block diffusion with the entropy-bound sampler

@dataclass(frozen=True)
class DiffusionGemmaSettings:
    steps: int  # denoising steps per canvas (max_denoising_steps)
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int | None
    confidence_threshold: float | None


def diffusion_gemma_settings(model: nn.Module, cfg: DecodeConfig) -> DiffusionGemmaSettings:
    """Map the explorer's options onto DiffusionGemma's: steps per canvas = steps / canvases;
    ``threshold`` is the entropy bound; temperature 0 keeps the model's own schedule (t_max -> t_min),
    a temperature T > 0 runs the schedule T -> T/2."""
    gc = getattr(model, "generation_config", None)
    sampler = getattr(gc, "sampler_config", None)

    def default(name: str) -> Any:
        value = getattr(gc, name, None)
        return DIFFUSION_DEFAULTS[name] if value is None else value

    canvases = math.ceil(cfg.max_new_tokens / model.config.canvas_length)
    steps = max(1, cfg.diffusion_steps // canvases) if cfg.steps is not None else default("max_denoising_steps")
    bound = cfg.threshold or (sampler.entropy_bound if sampler is not None else DIFFUSION_DEFAULTS["entropy_bound"])
    t_min, t_max = (default("t_min"), default("t_max")) if cfg.temperature == 0 else (
        cfg.temperature / 2, cfg.temperature)
    return DiffusionGemmaSettings(steps, float(bound), float(t_min), float(t_max), default("stability_threshold"),
                                  default("confidence_threshold"))


def accept_by_entropy(logits: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy-bound acceptance (EB-sampler, Ben-Hamu et al. 2025, arXiv 2505.24857): accept the k
    lowest-entropy positions with sum(entropy) - max(entropy) <= bound. Returns (mask, entropies)."""
    entropy = torch.distributions.Categorical(logits=logits).entropy()  # (B, C)
    sorted_entropy, order = torch.sort(entropy, dim=-1, descending=False)
    keep = torch.cumsum(sorted_entropy, dim=-1) - sorted_entropy <= bound
    return torch.scatter(torch.zeros_like(keep), -1, order, keep), entropy


def decode_diffusion_gemma(models: Models, prompt_ids: list[int],
                           cfg: DecodeConfig) -> Generator[Event, None, DecodeResult]:
    """DiffusionGemma's generate, one RefinementStep per denoising step (batch 1).

    Per canvas: encode the uncached tokens into the KV cache; start from uniform random tokens; each
    step runs the decoder on the canvas (self-conditioned on the last step's logits), divides the logits
    by the linear temperature schedule, samples a canvas, keeps the entropy-bound accepted positions,
    renoises the rest with fresh random tokens, and stops early once the argmax canvas is stable and
    confident. The canvas shown (and kept) is the argmax canvas, what ``streamer.put_draft`` receives.
    Random draws come from a generator seeded with ``cfg.seed`` on the model's device, in transformers'
    order (canvas, then per step: sample, renoise), so a run equals ``generate`` after ``torch.manual_seed``.
    An event lists the positions whose argmax token changed, so replaying the events rebuilds every draft.
    """
    t0 = time.perf_counter()
    model = models.diffusion
    s = diffusion_gemma_settings(model, cfg)
    device = model.device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    canvas_len, vocab = model.config.canvas_length, model.config.text_config.vocab_size
    eos = models.diffusion_tokenizer.eos_token_id
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    ids = torch.tensor([prompt_ids], device=device)
    cur_len = ids.shape[1]
    mask = torch.ones((1, cur_len), dtype=torch.bool, device=device)
    enc_pos = torch.arange(0, cur_len, dtype=torch.int32, device=device)[None]
    out: list[int] = []
    revealed_t: list[float] = []
    passes, forward_s, step = 0, 0.0, 0
    for block in range(math.ceil(cfg.max_new_tokens / canvas_len)):
        unprocessed = ids if block == 0 else ids[:, -canvas_len:]
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            enc_mask = model.model.encoder.create_masks_for_generate(
                config=model.config, inputs_embeds=torch.empty((1, unprocessed.shape[1], 0), dtype=model.dtype,
                                                               device=device),
                attention_mask=mask, past_key_values=cache, position_ids=enc_pos)
            model.model.encoder(input_ids=unprocessed, attention_mask=enc_mask, past_key_values=cache,
                                position_ids=enc_pos)
        synchronize(device)
        forward_s += time.perf_counter() - start
        dec_pos = torch.arange(cur_len, cur_len + canvas_len, dtype=torch.int32, device=device)[None]
        canvas = torch.randint(0, vocab, (1, canvas_len), generator=gen, device=device)
        argmax = canvas
        dec_mask = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=cache,
            decoder_attention_mask=torch.nn.functional.pad(mask, (0, canvas_len), value=True))
        history = None if not s.stability_threshold else torch.full(
            (s.stability_threshold, 1, canvas_len), -1, dtype=torch.long, device=device)
        self_cond, shown = None, [None] * canvas_len
        for cur_step in reversed(range(1, s.steps + 1)):
            synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode():
                logits = model(decoder_input_ids=canvas, self_conditioning_logits=self_cond,
                               decoder_attention_mask=dec_mask, past_key_values=cache,
                               decoder_position_ids=dec_pos).logits
            synchronize(device)
            dt = time.perf_counter() - start
            cur = torch.tensor(cur_step, device=device, dtype=torch.int32)
            logits = logits / (s.t_min + (s.t_max - s.t_min) * (cur / s.steps))  # linear temperature schedule
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            sampled = torch.multinomial(probs.view(-1, vocab), 1, generator=gen).view(1, canvas_len)
            argmax = logits.argmax(-1)
            accepted, entropy = accept_by_entropy(logits, s.entropy_bound)
            noise = torch.randint(0, vocab, (1, canvas_len), generator=gen, device=device)
            canvas = torch.where(accepted, sampled, noise)  # accept, then renoise the rest
            done = bool(entropy.mean() < s.confidence_threshold) if s.confidence_threshold is not None else False
            if history is not None:
                done = done and bool((history == argmax[None]).all())
                history = torch.roll(history, shifts=-1, dims=0)
                history[-1] = argmax
            self_cond = logits.to(model.model.decoder.embed_tokens.weight.dtype)
            passes, forward_s, step = passes + 1, forward_s + dt, step + 1
            now = time.perf_counter()
            draft = argmax[0].tolist()
            changed = [i for i, tok in enumerate(draft) if shown[i] != tok]
            conf = probs[0].gather(-1, argmax[0][:, None])[:, 0]
            for i in changed:
                shown[i] = draft[i]
            yield RefinementStep(t=now, step=step - 1, block=block,
                                 positions=tuple(block * canvas_len + i for i in changed),
                                 tokens=tuple(draft[i] for i in changed),
                                 confidences=tuple(float(conf[i]) for i in changed),
                                 masks_left=int((~accepted).sum()), forward_s=dt)
            if done:
                break
        now = time.perf_counter() - t0
        new = argmax[0].tolist()
        out += new
        revealed_t += [now] * len(new)
        ids = torch.cat([ids, argmax], dim=-1)
        if eos is not None and eos in new:
            break
        mask = torch.nn.functional.pad(mask, (0, canvas_len), value=True)
        enc_pos, cur_len = dec_pos, cur_len + canvas_len
    out = out[:cfg.max_new_tokens]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return DecodeResult(t0=t0, tokens=out, times=revealed_t[:len(out)], target_passes=passes,
                        target_forward_s=forward_s)


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
    from transformers import (
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
    from transformers import AutoModelForCausalLM, AutoTokenizer, DiffusionGemmaForBlockDiffusion

    from explorer.models import _require_network, build_byte_tokenizer

    if preset.target is None:
        tokenizer = build_byte_tokenizer()
        target, assistant, diffusion = (m.to(device, dtype) for m in build_random_gemma4(tokenizer))
        diff_tok, names = tokenizer, {k: f"{preset.name}/{k}" for k in ("target", "draft", "diffusion")}
    else:
        for model_id in (preset.target, preset.draft, preset.diffusion):
            _require_network(model_id)
        tokenizer = AutoTokenizer.from_pretrained(preset.target)
        target = AutoModelForCausalLM.from_pretrained(preset.target, dtype=dtype).to(device)
        with assistant_kv_sharing_fix():
            assistant = AutoModelForCausalLM.from_pretrained(preset.draft, dtype=dtype).to(device)
        diff_tok = AutoTokenizer.from_pretrained(preset.diffusion)
        diffusion = DiffusionGemmaForBlockDiffusion.from_pretrained(preset.diffusion, dtype=dtype).to(device)
        names = {"target": preset.target, "draft": preset.draft, "diffusion": preset.diffusion}
    return Models(preset, tokenizer, target, assistant, diffusion, diff_tok, device, dtype, names=names)
