"""The Gemma 4 family, all native to transformers 5.23 (no remote code): a Gemma 4 target, its assistant drafter
(``assistant.py``), DiffusionGemma's block diffusion with the entropy-bound sampler (``diffusion.py``), and the
``gemma-4`` / ``random-gemma4`` presets (``load.py``)."""

from explorer.decoding.registry import DiffusionSampler, FamilyDrafter, register_diffusion_sampler, register_drafter
from explorer.families.gemma.assistant import (
    AssistantDrafter,
    assistant_kv_sharing_fix,
    is_assistant,
    make_assistant_drafter,
)
from explorer.families.gemma.diffusion import (
    DIFFUSION_DEFAULTS,
    accept_by_entropy,
    decode_diffusion_gemma,
    diffusion_gemma_settings,
    is_diffusion_gemma,
)
from explorer.families.gemma.load import build_random_gemma4, load_gemma
from explorer.runtime import register_loader

# "assistant" with a Gemma 4 assistant as the draft (an EAGLE head, registered first, wins when both exist), and
# "model" when the preset's draft is an assistant (it cannot draft alone: it reads the target's hidden states).
register_drafter(FamilyDrafter(
    family="gemma", serves=lambda models, cfg: cfg.drafter in ("assistant", "model") and is_assistant(models.draft),
    offers_assistant=lambda models: is_assistant(models.draft), make=make_assistant_drafter))
register_diffusion_sampler(DiffusionSampler(family="gemma", applies=is_diffusion_gemma, decode=decode_diffusion_gemma))
register_loader("gemma-hub", load_gemma)
register_loader("gemma-random", load_gemma)

__all__ = ["DIFFUSION_DEFAULTS", "AssistantDrafter", "accept_by_entropy", "assistant_kv_sharing_fix",
           "build_random_gemma4", "decode_diffusion_gemma", "diffusion_gemma_settings", "is_assistant",
           "is_diffusion_gemma", "load_gemma", "make_assistant_drafter"]
