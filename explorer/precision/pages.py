"""The kernel weights in 2 MB pages (``huge_page_weights``), so that a pass, which streams every weight once, takes
a TLB miss per 2 MB rather than per 4 KB."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Iterable

import torch

HUGE_PAGE = 2 << 20


def huge_page_weights(linears: Iterable) -> int:
    """Move these layers' (``exact.RowInvariantLinear``) kernel weights into one anonymous mapping that Linux may
    back with 2 MB pages (``madvise(MADV_HUGEPAGE)``; transparent huge pages ``always`` or ``madvise``). A pass
    streams every weight once; on 4 KB pages it takes a TLB miss every 4 KB and the hardware prefetcher stops at each
    page's end.
    A pass of the default preset's int8 target costs 5-13% less on 2 MB pages (one and four tokens, Xeon AMX,
    2026-12-07, paths amx / avx512 / avx2; ``benchmarks/huge_pages.py``). The same values at new addresses: the same
    bits. Returns the bytes moved: 0 where the OS has no such advice (macOS) or with ``EXPLORER_NO_HUGE_PAGES=1``.
    Call it before a layer's first pass (``LeanLayer`` gathers its tensors then)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    mods = [m for m in linears if m.kernel_weight.device.type == "cpu"]
    if advice is None or not mods or os.environ.get("EXPLORER_NO_HUGE_PAGES", "") not in ("", "0"):
        return 0
    offsets, total = [], 0
    for m in mods:  # each weight at a 64-byte boundary (a cache line)
        offsets.append(total)
        total += -(-m.kernel_weight.nbytes // 64) * 64
    area = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # room for a 2 MB start
    start = -ctypes.addressof(ctypes.c_char.from_buffer(area)) % HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages: 4 KB pages, the same weights
        area.madvise(advice, start, len(area) - start)
    for m, offset in zip(mods, offsets, strict=True):
        w = m.kernel_weight
        moved = torch.frombuffer(area, dtype=torch.uint8, count=w.nbytes, offset=start + offset)
        m.kernel_weight = moved.view(w.dtype).view(w.shape).copy_(w)  # the tensor keeps the mapping alive
    return total
