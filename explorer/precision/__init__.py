"""Precision as a choice: how the target's weights are stored and whether its passes are row-invariant.

| precision | weights | kernels | greedy speculative == greedy autoregressive |
|---|---|---|---|
| ``float32`` | float32 | torch's | in practice (torch's summation order varies with the rows of a pass) |
| ``float32-exact`` | float32 | row-invariant (``rowinv.cpp``) | always |
| ``bfloat16-weights`` | bfloat16 | row-invariant | always |
| ``int8`` | int8, one scale per output channel | row-invariant (AMX tiles where the CPU has them) | always |

Activations and sums are float32 in every one (int8: activations rounded to 16-bit integers per row, integer
sums; on AMX each 16-bit activation is split exactly into two bytes, so the tiles give the same integers). A
token tree's verify pass is row-invariant too: the attention kernel takes the tree's mask.

An exact precision converts the target row-invariant and puts the EAGLE head, a causal Llama draft model and the
diffusion model on the same kernels in the same weight format (for speed, and so the page times the two paradigms
at one precision); the other drafters keep their own precision: exactness needs the verifier consistent with
itself, not with the drafter.
"""

from __future__ import annotations

import copy
import dataclasses
import sys

import torch

from explorer.errors import ExplorerError
from explorer.precision import kernels
from explorer.precision.exact import make_row_invariant, use_kernels_in_diffusion, use_kernels_in_eagle_head

PRECISIONS = {"float32": None, "float32-exact": "float32", "bfloat16-weights": "bfloat16", "int8": "int8"}
EXACT = tuple(p for p, fmt in PRECISIONS.items() if fmt is not None)
# The usual fastest exact precision on a CPU (int8 weights read a quarter of the bytes): benchmarks' default. A
# preset's own default is measured on the machine (``AUTO``: explorer/precision/choice.py).
FASTEST_EXACT = "int8"
AUTO = "auto"  # resolve_precision's answer for "measure at load and choose" (models._load_uncached)


def parse_preset(name: str) -> tuple[str, str | None]:
    """'smollm2-135m@int8' -> ('smollm2-135m', 'int8'); a name without '@' has no precision."""
    base, _, precision = name.partition("@")
    return base, precision or None


def resolve_precision(precision: str | None, device: torch.device, dtype: str | torch.dtype | None,
                      exact_by_default: bool) -> str | None:
    """The precision to apply (None: the dtype path, untouched; AUTO: measure the exact ones against float32 at load
    and take the fastest, explorer/precision/choice.py). Unknown, CUDA or a conflict: ExplorerError."""
    if precision is None:
        if not exact_by_default or dtype is not None or device.type != "cpu":
            return None
        try:
            kernels.load()
        except kernels.KernelUnavailable as exc:
            print(f"explorer: running float32, not an exact precision: {exc}", file=sys.stderr)
            return None
        return AUTO
    if precision not in PRECISIONS:
        raise ExplorerError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if PRECISIONS[precision] is None:
        if dtype is not None and dtype not in ("float32", "fp32", torch.float32):
            raise ExplorerError(f"precision 'float32' contradicts dtype {dtype!r}; give one of them")
        return precision
    if device.type != "cpu":
        raise ExplorerError(f"precision {precision!r} runs on a CPU only (its kernels are CPU kernels); "
                            "on a GPU use dtype instead")
    if dtype is not None:
        raise ExplorerError(f"precision {precision!r} sets the weights' format itself; give no dtype with it")
    try:
        kernels.load()
    except kernels.KernelUnavailable as exc:
        raise ExplorerError(f"precision {precision!r} is not available on this machine: {exc}") from None
    return precision


def apply_precision(models, precision: str | None, diffusion: bool = True, draft: bool = True):
    """Convert a bundle in place for an exact precision: the target (row-invariant), an EAGLE head and a causal
    Llama-family draft model (the same kernels, for speed: a drafter need not be row-invariant, its q is whatever
    it drew from; the draft not with ``draft=False``) and a transformers diffusion model (the same kernels and
    format: ``use_kernels_in_diffusion``; not with ``diffusion=False``). Nothing for float32 or the dtype path.
    Returns the bundle with ``precision`` set."""
    fmt = PRECISIONS.get(precision) if precision else None
    if fmt is None:
        return models
    try:
        make_row_invariant(models.target, fmt)
    except ValueError as exc:
        raise ExplorerError(f"precision {precision!r}: {exc}") from None
    if models.assistant is not None and hasattr(models.assistant, "layer"):
        use_kernels_in_eagle_head(models.assistant, fmt)
    if draft and is_kernel_draft_candidate(models.draft):
        make_row_invariant(models.draft, fmt)
        name = models.names.get("draft", "draft")
        models.names["draft"] = f"{name}, {precision} weights on the kernels"
    if diffusion and is_kernel_diffusion_candidate(models.diffusion):
        use_kernels_in_diffusion(models.diffusion, fmt)
        name = models.names.get("diffusion", "diffusion")
        models.names["diffusion"] = f"{name}, {precision} weights on the target's kernels"
    models.precision = precision
    return models


def is_kernel_draft_candidate(model) -> bool:
    """A draft model the kernels can take: a causal Llama-family body (transformers' own, or the trimmed-head
    draft built on it) whose layers are transformers' Llama layers."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return (layers is not None and len(layers) > 0
            and all(type(layer).__module__.startswith("transformers.models.llama") for layer in layers)
            and all(getattr(layer.self_attn, "is_causal", True) for layer in layers))


def is_kernel_diffusion_candidate(model) -> bool:
    """A diffusion model the kernels can take: transformers' own Llama-family code (not remote code), bias-free."""
    return (model is not None and type(model).__module__.startswith("transformers.models.llama")
            and hasattr(model, "model") and hasattr(model.model, "layers"))


def converted_copy(models, precision: str):
    """A float32 bundle at another precision without loading it again: the target and EAGLE head copied and
    converted as ``load_models`` converts them, the other drafters and the diffusion model shared, unconverted
    (tests, benchmarks of the target)."""
    if PRECISIONS[precision] is None:
        return models
    bundle = dataclasses.replace(models, target=copy.deepcopy(models.target),
                                 assistant=copy.deepcopy(models.assistant))
    if bundle.assistant is not None and hasattr(bundle.assistant, "attach"):
        bundle.assistant.attach(bundle.target)  # share the copy's embedding, as loading does
    return apply_precision(bundle, precision, diffusion=False, draft=False)
