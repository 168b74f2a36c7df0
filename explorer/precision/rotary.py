"""A transformers rotary embedding that reads its cos and sin from a table made once (``rotary_table``)."""

from __future__ import annotations

import types

import torch
from torch import nn


def rotary_table(body: nn.Module) -> None:
    """Give a transformers model body's rotary embedding (``body.rotary_emb``), if it is of the default kind (fixed
    frequencies), a table of its cos and sin for positions 0 .. ``max_position_embeddings`` - 1, computed once at one
    thread by its own forward, and a forward that reads the table (elementwise ops: the bits its own forward gives
    for those positions alone, tests/test_precision.py). Why: its forward takes cos and sin of every pass through
    torch's vectorised math (MKL's VML where torch has it), which splits more than 2048 elements across threads, and
    a thread's first such call can round otherwise (seen at two threads on the Xeon AMX, 2026-12-07: a process's
    first 37-token pass differed from later ones in 1 of 8 runs): a pass's bits must not depend on which thread
    computed what. Positions past the table, or another kind of rotary embedding (dynamic frequencies), keep its
    own forward."""
    rotary = getattr(body, "rotary_emb", None)
    positions = int(getattr(getattr(body, "config", None), "max_position_embeddings", 0) or 0)
    if getattr(rotary, "rope_type", None) != "default" or positions <= 0:
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # at load: no other decode runs beside it
    try:
        with torch.inference_mode():
            device = rotary.inv_freq.device
            cos, sin = type(rotary).forward(rotary, torch.empty(0, device=device),
                                            torch.arange(positions, device=device)[None])
    finally:
        torch.set_num_threads(before)
    rotary.table = (cos[0], sin[0])  # (positions, head_dim) float32
    rotary.forward = types.MethodType(_table_rotary_forward, rotary)


def _table_rotary_forward(self, x: torch.Tensor, position_ids: torch.Tensor):
    cos, sin = self.table
    if position_ids.numel() == 0 or int(position_ids.max()) >= cos.shape[0] or cos.device != x.device:
        return type(self).forward(self, x, position_ids)
    return cos[position_ids].to(x.dtype), sin[position_ids].to(x.dtype)
