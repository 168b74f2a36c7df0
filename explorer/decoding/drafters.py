"""The drafters behind one small interface, the ``Drafter`` protocol that ``make_drafter`` returns.

Here: a small model or the target's first layers (``ModelDrafter``), prompt lookup, the diffusion
model; in their families' folders, found through registry.py: EAGLE's feature drafter and Gemma's assistant.
A deterministic drafter (prompt lookup) returns one-hot rows: exactness still holds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache

from explorer.decoding.config import DRAFTERS, DecodeConfig
from explorer.decoding.diffusion import denoise, resolve_cache, reveal_schedule, takes_kv_cache
from explorer.decoding.draft import Draft, Drafter
from explorer.decoding.registry import family_drafter, offers_assistant
from explorer.decoding.sampling import sample, token_probability, warp_logits
from explorer.errors import ExplorerError
from explorer.runtime import Models, check_same_vocabulary, timed_forward


@dataclass
class ModelDrafter:
    """A small causal LM with its own KV cache (Leviathan et al. 2023, Chen et al. 2023)."""

    model: nn.Module
    eos_id: int | None
    name: str = "model"
    cache: DynamicCache = field(default_factory=DynamicCache)

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, gen: torch.Generator) -> Draft:
        device = self.model.device
        feed = tokens[self.cache.get_seq_length():]  # everything the draft has not seen yet
        drafted, rows, seconds, sure = [], [], 0.0, 1.0
        for _ in range(gamma):
            logits, dt = timed_forward(self.model, torch.tensor([feed], device=device), self.cache, keep=1)
            seconds += dt
            q = warp_logits(logits[0, -1], cfg.temperature, cfg.top_k, cfg.top_p)  # (V,)
            token = sample(q, gen)
            drafted.append(token)
            rows.append(q)
            if token == self.eos_id:  # nothing after an EOS can be kept
                break
            if cfg.draft_confidence is not None:  # EAGLE-2's value of a draft: the product of its probabilities
                sure *= token_probability(logits[0, -1], token)
                if sure < cfg.draft_confidence:
                    break
            feed = [token]
        return Draft(drafted, torch.stack(rows), seconds, len(drafted))

    def rollback(self, keep: int) -> None:
        crop_cache(self.cache, keep)

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()


@dataclass
class PromptLookupDrafter:
    """Prompt lookup decoding (Saxena 2023): copy what followed the last n-gram's latest earlier match."""

    vocab_size: int
    max_ngram: int = 3
    name: str = "prompt_lookup"
    device: torch.device | str = "cpu"  # where q is made: the target's device, where p lives

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, gen: torch.Generator) -> Draft:
        drafted = find_continuation(tokens, gamma, self.max_ngram)
        if not drafted:
            return Draft([], None)
        q = torch.nn.functional.one_hot(torch.tensor(drafted, device=self.device), self.vocab_size).float()  # (g, V)
        return Draft(drafted, q)

    def rollback(self, keep: int) -> None:
        pass

    @property
    def cache_len(self) -> None:
        return None


@dataclass
class DiffusionDrafter:
    """The preset's masked-diffusion model drafts gamma tokens in parallel (as DFlash, vLLM 0.32).

    The prefix is followed by gamma masks; one denoiser pass predicts every masked position and
    token i is drawn from q_i, that pass's warped distribution at position i. With ``passes`` > 1
    the draft is refined: each pass commits the leftmost still-masked positions (reveal_schedule
    of gamma over the passes) and predicts the rest again, seeing what was committed. Committing
    left to right keeps q_i a function of the prefix and the drafts before i only, which the
    verification rule needs: a token committed by confidence after a later one would have a q that
    depends on that later token, and accepting the earlier one would tilt the later one's
    distribution away from its q. With ``cached`` the keys and values of the prefix are kept
    between proposals (each pass feeds only what they lack); the drafts stay exact whatever the
    cache's staleness, because q_i is always the distribution token i was drawn from.
    """

    model: nn.Module
    mask_id: int
    shift: int  # 1 when logits at i predict position i + 1
    banned: list[int]
    eos_id: int | None
    passes: int = 1
    cached: bool = True
    name: str = "diffusion"
    cache: DynamicCache | None = None

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, gen: torch.Generator) -> Draft:
        p = len(tokens)
        x = torch.tensor([tokens + [self.mask_id] * gamma], device=self.model.device)  # (1, P + gamma)
        if self.cached and self.cache is None:
            self.cache = DynamicCache()
        banned = torch.tensor(self.banned, device=x.device, dtype=torch.long)
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        stages, seconds = [], 0.0
        for count in reveal_schedule(gamma, min(self.passes, gamma)):
            lo = p + len(drafted)  # the first still-masked position
            start = min(self.cache.get_seq_length(), p - self.shift) if self.cached else 0
            ahead = list(range(lo - self.shift, p + gamma - self.shift))  # the logits that predict the masks
            logits, dt, _ = denoise(self.model, x, start, x.shape[1], ahead, self.cache, fill=self.cached)
            if self.cached:  # keep the prefix this pass computed, never a drafted position
                crop_cache(self.cache, p - self.shift)
            seconds += dt
            logits = logits.float().index_fill(1, banned, float("-inf"))  # never draft a mask
            q = warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)  # (masks left, V)
            for i in range(count):
                drafted.append(sample(q[i], gen))
                rows.append(q[i])
                x[0, lo + i] = drafted[-1]
                if drafted[-1] == self.eos_id:
                    break
            rest = q[len(drafted) - (lo - p):]  # the positions still masked, as this pass predicts them
            tentative = rest.argmax(-1).tolist()
            shown = [float(r[t]) for r, t in zip(rows, drafted, strict=True)] + [
                float(r[t]) for r, t in zip(rest, tentative, strict=True)]
            stages.append((tuple(drafted + tentative), tuple(shown), dt))
            if drafted[-1] == self.eos_id:
                break
        return Draft(drafted, torch.stack(rows), seconds, len(stages), stages if len(stages) > 1 else [])

    def rollback(self, keep: int) -> None:
        if self.cache is not None:
            crop_cache(self.cache, keep - self.shift)

    @property
    def cache_len(self) -> int | None:
        return self.cache.get_seq_length() if self.cache is not None else None


def same_tokenizer(a, b) -> bool:
    """One tokenizer object, or two with the same vocabulary."""
    return a is b or (hasattr(a, "get_vocab") and hasattr(b, "get_vocab") and a.get_vocab() == b.get_vocab())


def diffusion_drafter(models: Models, cfg: DecodeConfig) -> DiffusionDrafter:
    name = models.preset.name
    if models.diffusion is None:
        raise ExplorerError(f"preset {name!r} has no diffusion model; the diffusion drafter needs one")
    if not same_tokenizer(models.tokenizer, models.diffusion_tokenizer):
        raise ExplorerError(f"the diffusion drafter needs a diffusion model with the target's tokenizer; the "
                            f"diffusion model of preset {name!r} uses another tokenizer (choose another drafter)")
    check_same_vocabulary(models.target, models.diffusion)
    mask = models.mask_token_id
    if mask is None:
        raise ExplorerError("the diffusion model's tokenizer has no mask token")
    banned = [i for i in {mask, getattr(models.tokenizer, "pad_token_id", None)} if i is not None]
    return DiffusionDrafter(models.diffusion, mask, int(bool(models.diffusion_shift)), banned,
                            models.tokenizer.eos_token_id, cfg.draft_passes,
                            cfg.cache != "none" and takes_kv_cache(models.diffusion)
                            and resolve_cache(models.diffusion, cfg.cache or "prefix") != "none")  # by default: cached


def find_continuation(tokens: list[int], gamma: int, max_ngram: int) -> list[int]:
    """Longest n-gram first; among its earlier occurrences the most recent one with a full gamma
    continuation wins (in repeating output the latest match runs into the end), else the longest."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        pattern, best = tokens[-n:], []
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == pattern:
                found = tokens[start + n:start + n + gamma]
                if len(found) == gamma:
                    return found
                best = max(best, found, key=len)
        if best:
            return best
    return []


def shallow_model(target: nn.Module, layers: int) -> nn.Module:
    """The target's first ``layers`` decoder layers + its final norm and LM head, sharing weights.

    Early-exit self-speculation (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023),
    without the early-exit training: the exit is the target's own head.
    """
    total = target.config.num_hidden_layers
    if not 1 <= layers < total:
        raise ExplorerError(f"early_exit_layers must be between 1 and {total - 1} (got {layers})")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    shallow = copy.copy(target)  # a new module object whose submodules are the target's
    shallow._modules = dict(target._modules)
    body = copy.copy(target.model)
    body._modules = dict(target.model._modules)
    body._modules["layers"] = nn.ModuleList(list(target.model.layers)[:layers])
    body.config = config
    shallow._modules["model"] = body
    shallow.config = config
    return shallow


def available_drafters(models: Models) -> list[str]:
    """The drafters this bundle can run (what the UI offers and the bench sweeps)."""
    usable = {"model": models.draft is not None, "diffusion": models.diffusion is not None
              and same_tokenizer(models.tokenizer, models.diffusion_tokenizer) and models.mask_token_id is not None,
              "assistant": offers_assistant(models),
              "early_exit": hasattr(getattr(models.target, "model", None), "layers")
              and getattr(models.target.config, "num_hidden_layers", 0) >= 2}  # a shallow copy needs 1 of 2+ layers
    return [d for d in DRAFTERS if usable.get(d, True)]


def make_drafter(models: Models, cfg: DecodeConfig) -> Drafter:
    """The drafter ``cfg.drafter`` names, built on ``models``; ExplorerError when the preset cannot run it."""
    eos = models.tokenizer.eos_token_id
    family = family_drafter(models, cfg)  # a model family's own drafter (explorer/families), by registration
    if family is not None:
        return family.make(models)
    if cfg.drafter == "assistant":
        raise ExplorerError(f"preset {models.preset.name!r} has no drafter that reads the target's hidden "
                            "states (a Gemma 4 assistant or an EAGLE head); drafter 'assistant' needs one "
                            "(presets 'smollm2-135m', 'gemma-4')")
    if cfg.drafter == "model":
        if models.draft is None:
            raise ExplorerError(f"preset {models.preset.name!r} has no draft model; use drafter "
                                "'prompt_lookup' or 'early_exit'")
        check_same_vocabulary(models.target, models.draft)
        return ModelDrafter(models.draft, eos)
    if cfg.drafter == "prompt_lookup":
        vocab = models.target.get_output_embeddings().weight.shape[0]
        return PromptLookupDrafter(vocab, cfg.max_ngram, device=models.device)
    if cfg.drafter == "early_exit":
        if not hasattr(models.target, "model") or not hasattr(models.target.model, "layers"):
            raise ExplorerError("early exit needs a decoder with model.layers (Llama, Qwen, SmolLM ...)")
        layers = cfg.early_exit_layers or models.preset.early_exit_layers or max(
            1, models.target.config.num_hidden_layers // 3)
        return ModelDrafter(shallow_model(models.target, layers), eos, name="early_exit")
    if cfg.drafter == "diffusion":
        return diffusion_drafter(models, cfg)
    raise ExplorerError(f"unknown drafter {cfg.drafter!r}")


def crop_cache(cache: DynamicCache, keep: int) -> None:
    """Roll a KV cache back so it holds exactly the first ``keep`` positions (or fewer)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)
