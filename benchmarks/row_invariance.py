"""Which ops give row i of an M-row call bit for bit what a one-row call gives (M = 1..16), on this CPU.

    python benchmarks/row_invariance.py

One torch thread. Each op runs on 16 random rows, then on the first M rows for every M, and each result is
compared (torch.equal) with the rows computed one at a time. The table lists the row counts that differ
and what a 4-row call costs against a one-row call (CPU time, median of 50 calls: the work, not the queue).
Shapes are SmolLM2-135M's: (N, K) = (576, 576) q/o, (192, 576) k/v, (1536, 576) gate/up, (576, 1536) down.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explorer.measure.bench_cli import cpu_name  # noqa: E402
from explorer.precision import kernels  # noqa: E402
from explorer.precision.exact import RowInvariantLinear  # noqa: E402

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536)]
ROWS = 16


def differing(fn, x: torch.Tensor) -> list[int]:
    alone = torch.cat([fn(x[i:i + 1]) for i in range(len(x))])
    return [m for m in range(1, len(x) + 1) if not torch.equal(fn(x[:m]), alone[:m])]


def cost_ratio(fn, x: torch.Tensor) -> float:
    def cpu(rows):
        times = []
        for _ in range(50):
            start = time.thread_time()
            fn(rows)
            times.append(time.thread_time() - start)
        return statistics.median(times)

    return cpu(x[:4]) / max(cpu(x[:1]), 1e-9)


def shown(rows: list[int]) -> str:
    if not rows:
        return "none"
    if rows == list(range(rows[0], ROWS + 1)):
        return f"M >= {rows[0]}"
    return ", ".join(map(str, rows))


def linear_ops(w: torch.Tensor) -> dict:
    scale = w.abs().amax(1) / 127
    q = torch.round(w / scale[:, None]).to(torch.int8)
    wt, wb = w.t().contiguous(), w.to(torch.bfloat16)
    ops = {
        "torch F.linear float32": lambda x: F.linear(x, w),
        "torch mm, W pre-transposed, float32": lambda x: x @ wt,
        "torch F.linear bfloat16": lambda x: F.linear(x.to(torch.bfloat16), wb),
        "torch _weight_int8pack_mm": lambda x: torch.ops.aten._weight_int8pack_mm(x, q, scale),
    }
    for fmt in ("float32", "bfloat16", "int8"):
        layer = RowInvariantLinear(w, fmt)
        ops[f"rowinv linear, {fmt} weights" + (" (16-bit integer activations)" if fmt == "int8" else "")] = layer
    return ops


def attention_ops() -> dict:
    def sdpa(q, k, v):
        m, length = q.shape[1], k.shape[1]
        mask = torch.ones(m, length, dtype=torch.bool).tril(length - m)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]

    def kernel(q, k, v):
        return kernels.load().attend(q, k, v, q.shape[-1] ** -0.5).transpose(0, 1)

    return {"torch sdpa, causal block (9 heads / 3 KV, 40 cached)": sdpa, "rowinv attend": kernel}


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print(f"{cpu_name()}, kernel path {kernels.load().path()}, torch {torch.__version__}, 1 thread")
    print("| op | shape (N, K) | row counts M whose rows differ from one-row calls | 4-row / 1-row cost |")
    print("|---|---|---|---|")
    for n, k in SHAPES:
        w, x = torch.randn(n, k, generator=gen), torch.randn(ROWS, k, generator=gen)
        for name, fn in linear_ops(w).items():
            print(f"| {name} | ({n}, {k}) | {shown(differing(fn, x))} | {cost_ratio(fn, x):.2f} |", flush=True)
    q, k, v = torch.randn(9, ROWS, 64, generator=gen), *(torch.randn(3, 40 + ROWS, 64, generator=gen) for _ in "kv")
    for name, fn in attention_ops().items():
        def over(rows, lo=0, fn=fn):  # query rows lo.. of the block see the keys up to their own position
            m = rows.shape[1]
            return fn(rows, k[:, :40 + lo + m], v[:, :40 + lo + m]).transpose(0, 1)  # (M, H, D)
        alone = torch.cat([over(q[:, i:i + 1], i) for i in range(ROWS)])
        bad = [m for m in range(1, ROWS + 1) if not torch.equal(over(q[:, :m]), alone[:m])]
        ratio = cost_ratio(lambda r, o=over: o(r.transpose(0, 1)), q.transpose(0, 1))
        print(f"| {name} | q (9, M, 64) | {shown(bad)} | {ratio:.2f} |")
    norm_w = torch.randn(576, generator=gen)
    rms = lambda x: norm_w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))  # noqa: E731
    x = torch.randn(ROWS, 576, generator=gen)
    print(f"| torch RMSNorm (Llama's) | 576 | {shown(differing(rms, x))} | {cost_ratio(rms, x):.2f} |")
    cos, sin = torch.randn(ROWS, 64, generator=gen), torch.randn(ROWS, 64, generator=gen)
    qr = torch.randn(ROWS, 64, generator=gen)

    def rope(rows):
        m = rows.shape[0]
        return rows * cos[:m] + torch.cat([-rows[:, 32:], rows[:, :32]], -1) * sin[:m]

    alone = torch.cat([qr[i:i + 1] * cos[i:i + 1] + torch.cat([-qr[i:i + 1, 32:], qr[i:i + 1, :32]], -1) * sin[i:i + 1]
                       for i in range(ROWS)])
    bad = [m for m in range(1, ROWS + 1) if not torch.equal(rope(qr[:m]), alone[:m])]
    print(f"| torch rotary (rotate_half) | head 64 | {shown(bad)} | {cost_ratio(rope, qr):.2f} |")


if __name__ == "__main__":
    main()
