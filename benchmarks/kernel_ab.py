"""The int8 kernel of another commit against this tree's, both built for one path and loaded in one process, timed
call by call in turn (the outputs must be equal: the kernels give the same integers whatever their tiles).

    python benchmarks/kernel_ab.py --old 05104b4 [--isa avx2] [--threads 1] [--calls 400]

Shapes of the default preset's target (SmolLM2-135M: hidden 576, MLP 1536), 1-7 rows. Prints the median us per call
of old / new. The builds go to a temporary folder (about a minute each).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explorer.precision import kernels  # noqa: E402


def build(tag: str, sources: Path, out: Path, isa: str):
    from torch.utils.cpp_extension import load  # deferred: setuptools

    out.mkdir(parents=True, exist_ok=True)
    return load(name=f"rowinv_ab_{tag}", sources=[str(sources / "rowinv.cpp")],
                extra_cflags=kernels.COMMON + kernels.compile_flags(isa) + kernels.thread_flags(),
                extra_ldflags=kernels.thread_flags(), build_directory=str(out), verbose=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="a commit whose explorer/precision kernels are the baseline")
    p.add_argument("--isa", default=None, help="kernel path (default: the best this CPU has)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=400)
    args = p.parse_args()
    isa = args.isa or kernels.cpu_isas()[0]
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "old"
        old_src.mkdir()
        for name in ("rowinv.cpp", *(h.name for h in kernels.HEADERS)):
            text = subprocess.run(["git", "show", f"{args.old}:explorer/precision/{name}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
            (old_src / name).write_text(text)
        mods = {"old": build("old", old_src, Path(tmp) / "build_old", isa),
                "new": build("new", kernels.SOURCE.parent, Path(tmp) / "build_new", isa)}
        torch.set_num_threads(args.threads)
        print(f"path {isa}, {args.threads} thread(s), old = {args.old}, new = this tree; median us per call")
        g = torch.Generator().manual_seed(0)
        for n, k in ((1536, 576), (576, 576), (576, 1536)):
            w = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
            scale = torch.rand(n, generator=g) / 100
            cells = []
            for m in (1, 2, 3, 4, 5, 7):
                x = torch.randn(m, k, generator=g)
                if not torch.equal(mods["old"].linear_a16(x, w, scale), mods["new"].linear_a16(x, w, scale)):
                    raise SystemExit(f"{n}x{k}, {m} rows: the two builds differ")
                times = {tag: [] for tag in mods}
                for _ in range(args.calls):
                    for tag, mod in mods.items():
                        start = time.perf_counter()
                        mod.linear_a16(x, w, scale)
                        times[tag].append(time.perf_counter() - start)
                old, new = (statistics.median(times[t]) * 1e6 for t in ("old", "new"))
                cells.append(f"{m} rows {old:.0f} / {new:.0f}")
            print(f"{n} x {k}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
