"""Weights stored compactly: int8 with one scale per output row, or int4 in groups, in one ``.safetensors`` file.

Every floating 2-D tensor of at least ``MIN_NUMEL`` elements is stored as int8 ``q`` with a float32
scale per row (``absmax(row) / 127``, symmetric): ``w ~ q * scale``, an error of at most half a step,
``absmax(row) / 254``, per element. Other floating tensors (norms, biases, small matrices) are stored in
float16 (bfloat16 ones as they are; float32 ones whose values float16 cannot hold stay float32); integer
tensors (kept token ids) are stored unchanged. The file's metadata carries ``{"format": FORMAT}``, so a
loader tells a compact file from a plain one; ``load_weights`` reads both and returns float32 for every
floating tensor of a compact file (the caller casts to the dtype it wants), a plain file's tensors as stored.

The int4 form (``bits=4``; marker ``{"format": FORMAT4, "group": "G"}``) is for models whose outputs are not
an exactness reference (drafters, the tiny diffusion model): each such 2-D tensor is cut into groups of ``G``
consecutive elements along each row, quantized symmetrically to -7..7 (``scale = absmax(group) / 7``, the
scale stored in float16, rounded up so no element clips; float32 if float16 cannot hold it), an error of at
most half a step, ``scale / 2``, per element. Two values share a byte: element ``2j`` in the low nibble,
``2j + 1`` in the high one, each stored as ``q + 8`` (1..15; -8 is never produced). A tensor whose row length
is not a multiple of ``G`` falls back to int8 rows in the same file; small and 1-D tensors are as above.

**Differences from a reference** (``reference=`` on save and load; marker ``{"delta": "[names]"}``): a model
made by fine-tuning copies of another model's tensors (the SmolLM2 draft: the target's first layers and its
embedding rows as the head; the EAGLE head's layer: the target's last) stores, for each tensor named there,
the difference ``w - ref`` in int4 groups instead of ``w`` (the other tensors as ``bits`` says); the loader
adds the reference back. The error is a share of the difference (5-15% of the weight here), not of the
weight: about as close as int8 rows of the weight, at about half the bytes. A file with differences cannot
be read without its reference (``load_weights`` says so).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from explorer.errors import ExplorerError

FORMAT = "explorer-int8-rows"
FORMAT4 = "explorer-int4-groups"
FORMATS = (FORMAT, FORMAT4)
SCALE = ".int8_row_scale"  # the scale of tensor NAME is stored as NAME + SCALE
SCALE4 = ".int4_group_scale"  # int4: the group scales of tensor NAME, (rows, cols / G)
GROUP = 32  # int4 group size: 32 kept tiny's draft's acceptance better than 64 (benchmarks/compact_quality.py)
MIN_NUMEL = 4096
FP16_MAX = 6e4


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 q, float32 scale (rows, 1)) with w ~ q * scale; a zero row gets scale 0."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    q = torch.round(w / torch.where(scale > 0, scale, 1)).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_groups(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 packed (rows, cols / 2), scale (rows, cols / group)) of a 2-D ``w`` whose row length is a
    multiple of ``group`` (an even number): int4 -7..7 per element, ``w ~ q * scale`` group by group."""
    w = w.detach().float()
    rows, cols = w.shape
    if group % 2 or cols % group:
        raise ValueError(f"row length {cols} is not a multiple of the (even) group {group}")
    g = w.reshape(rows, cols // group, group)
    exact = g.abs().amax(dim=2) / 7
    if exact.max().item() < FP16_MAX:  # float16 scales, rounded up where float16 rounded them down
        scale = exact.half()
        low = scale.float() < exact
        scale = torch.where(low, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    else:
        scale = exact
    s = scale.float().unsqueeze(2)
    q = torch.round(g / torch.where(s > 0, s, 1)).clamp(-7, 7).to(torch.int16).reshape(rows, cols) + 8
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), scale.contiguous()


def dequantize_groups(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``w`` back from ``quantize_groups``'s output (the group size follows from the shapes)."""
    rows, half = packed.shape
    p = packed.to(torch.int16)
    q = torch.stack(((p & 0xF) - 8, (p >> 4) - 8), dim=2).reshape(rows, 2 * half).float()
    group = 2 * half // scale.shape[1]
    return (q.reshape(rows, -1, group) * scale.float().unsqueeze(2)).reshape(rows, 2 * half)


def compact_state(state: dict[str, torch.Tensor], min_numel: int = MIN_NUMEL, bits: int = 8,
                  group: int = GROUP, reference: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors a compact file stores for ``state`` (see the module docstring); ``bits`` 8 or 4; a tensor
    named in ``reference`` (same shape) is stored as its difference from it."""
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, not {bits}")
    out = {}
    for name, t in state.items():
        t = t.detach().cpu()
        four = bits == 4
        if reference is not None and name in reference:
            ref = reference[name].detach().cpu()
            if ref.shape != t.shape or not t.is_floating_point():
                raise ValueError(f"reference for {name} has shape {tuple(ref.shape)}, the tensor {tuple(t.shape)}")
            t, four = t.float() - ref.float(), True  # a difference is always stored as int4 groups
        if not t.is_floating_point():
            out[name] = t.contiguous()
        elif t.dim() == 2 and t.numel() >= min_numel and four and t.shape[1] % group == 0:
            out[name], out[name + SCALE4] = quantize_groups(t, group)
        elif t.dim() == 2 and t.numel() >= min_numel:
            out[name], out[name + SCALE] = quantize_rows(t)
        elif t.dtype == torch.float32 and t.abs().max().item() >= FP16_MAX:
            out[name] = t.contiguous()
        else:
            out[name] = (t if t.dtype == torch.bfloat16 else t.to(torch.float16)).contiguous()
    return out


def save_compact(state: dict[str, torch.Tensor], path: Path | str, min_numel: int = MIN_NUMEL, bits: int = 8,
                 group: int = GROUP, reference: dict[str, torch.Tensor] | None = None) -> None:
    """Write ``state`` compactly; the tensors named in ``reference`` as differences from it (see above)."""
    delta = sorted(n for n in state if reference is not None and n in reference)
    meta = {"format": FORMAT} if bits == 8 and not delta else {"format": FORMAT4, "group": str(group)}
    if delta:
        meta["delta"] = json.dumps(delta)
    save_file(compact_state(state, min_numel, bits, group, reference), str(path), metadata=meta)


def save_weights(state: dict[str, torch.Tensor], path: Path | str, dtype: torch.dtype | None = None,
                 bits: int = 8, reference: dict[str, torch.Tensor] | None = None) -> None:
    """A model file: plain in ``dtype`` when one is given, else compact (``save_compact``, with ``reference``)."""
    if dtype is None:
        save_compact(state, path, bits=bits, reference=reference)
    else:
        save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()},
                  str(path))


def compact_format(path: Path | str) -> str | None:
    """FORMAT or FORMAT4 by ``path``'s metadata marker, None for a plain file (the tensors are not read)."""
    with safe_open(str(path), framework="pt") as f:
        fmt = (f.metadata() or {}).get("format")
    return fmt if fmt in FORMATS else None


def is_compact(path: Path | str) -> bool:
    """Whether ``path`` is a compact file, int8 rows or int4 groups (by its metadata marker)."""
    return compact_format(path) is not None


def dequantize(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A compact file's tensors back as a state dict: floating tensors in float32, integers unchanged."""
    state = {}
    for name, t in stored.items():
        if name.endswith((SCALE, SCALE4)):
            continue
        if name + SCALE4 in stored:
            state[name] = dequantize_groups(t, stored[name + SCALE4])
        elif name + SCALE in stored:
            state[name] = t.float() * stored[name + SCALE].float()
        else:
            state[name] = t.float() if t.is_floating_point() else t
    return state


def delta_names(path: Path | str) -> list[str]:
    """The tensors ``path`` stores as differences from a reference (empty for most files)."""
    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("delta", "[]"))


def load_weights(path: Path | str, reference=None) -> dict[str, torch.Tensor]:
    """The state dict in ``path``, compact (dequantized to float32) or plain (as stored).

    ``reference(name, state)``: the tensor a difference was taken from (``state``: the file's other tensors,
    e.g. a draft's kept token ids), for the files that store differences (``delta_names``)."""
    stored = load_file(str(path))
    if not is_compact(path):
        return stored
    state = dequantize(stored)
    names = delta_names(path)
    if names and reference is None:
        raise ExplorerError(f"{path} stores differences from another model's weights; load it with that model")
    for name in names:
        ref = reference(name, state)
        if ref is None or tuple(ref.shape) != tuple(state[name].shape):
            raise ExplorerError(f"{path}: no reference of shape {tuple(state[name].shape)} for {name}")
        state[name] = state[name] + ref.detach().to(device="cpu", dtype=torch.float32)
    return state


def from_pretrained(auto_class, folder: Path | str, dtype: torch.dtype = torch.float32):
    """``auto_class.from_pretrained(folder, dtype=dtype)`` that also reads a compact ``model.safetensors``:
    the model is built from ``config.json`` and given the dequantized state (tied weights tied again)."""
    from transformers import AutoConfig, GenerationConfig  # deferred: transformers auto classes (~0.4 s to import)

    folder = Path(folder)
    weights = folder / "model.safetensors"
    if not weights.exists() or not is_compact(weights):
        return auto_class.from_pretrained(folder, dtype=dtype)
    config = AutoConfig.from_pretrained(folder)
    model = auto_class.from_config(config)
    missing, unexpected = model.load_state_dict(load_weights(weights), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{weights} does not match {folder / 'config.json'}: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    model.tie_weights()
    if (folder / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.to(dtype).eval()


def main(argv: list[str] | None = None) -> None:
    """Rewrite ``.safetensors`` files in the compact form, in place (files already in that form are left alone;
    an int8 file given --bits 4 is converted from its dequantized values: convert from the original instead)."""
    ap = argparse.ArgumentParser(prog="python -m explorer.compact_weights", description=main.__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--bits", type=int, choices=(8, 4), default=8)
    ap.add_argument("--group", type=int, default=GROUP)
    args = ap.parse_args(argv)
    want = FORMAT if args.bits == 8 else FORMAT4
    for path in args.files:
        before = path.stat().st_size
        if compact_format(path) != want:
            save_compact(load_weights(path), path, bits=args.bits, group=args.group)
        print(f"{path}: {before / 2**20:.2f} -> {path.stat().st_size / 2**20:.2f} MiB")


def read_draft_files(path: Path, reference=None) -> tuple[dict, dict, Path]:
    """(Llama config without our own keys, tensors, the weights file) of a saved draft folder; a missing
    or corrupt file raises ExplorerError naming it (shared by the trimmed draft and the EAGLE head);
    ``reference`` as for ``load_weights``."""
    config_file, weights_file = path / "config.json", path / "model.safetensors"
    for f in (config_file, weights_file):
        if not f.exists():
            raise ExplorerError(f"draft file missing: {f}")
    try:
        raw = json.loads(config_file.read_text())
        state = load_weights(weights_file, reference)
    except (json.JSONDecodeError, SafetensorError, OSError) as exc:
        bad = config_file if isinstance(exc, json.JSONDecodeError) else weights_file
        raise ExplorerError(f"draft file is corrupt: {bad} ({exc})") from None
    own = ("architectures", "kept_vocab", "embedding", "lm_head")
    return {k: v for k, v in raw.items() if k not in own}, state, weights_file


if __name__ == "__main__":
    main()
