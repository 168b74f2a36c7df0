"""The diffusion KV-cache sweep (`explorer bench --sweep cache`) one (N, prompt) cell per process.

    python benchmarks/cache_cells.py cell N INDEX [REPEATS]   # AR, cache none / prefix / dual, interleaved
    python benchmarks/cache_cells.py table                    # pool every cell written so far

Same configs as the sweep (K = N/4, blocks of 32, EOS ignored, quality scored); each cell is written
to runs/issue10/ as soon as it is done, so a slow shared machine still yields the finished cells.
"""
import dataclasses
import glob
import sys

import pandas as pd
import torch

import explorer
from explorer.measure import bench, sweeps
from explorer.measure.workload import load_prompt_sets

OUT = "runs/issue10"


def cell(n: int, index: int, repeats: int) -> None:
    models = explorer.load_models("tiny", device="cpu")
    ps = load_prompt_sets("code", index + 1)[0]
    one = [dataclasses.replace(ps, prompts=(ps.prompts[index],))]
    opts = {"max_new_tokens": n, "steps": n // 4, "block_length": bench.CACHE_BLOCK}
    configs = [bench.RunConfig("autoregressive", f"autoregressive N={n}", {"max_new_tokens": n}, f"N={n}", n)]
    configs += [bench.RunConfig("diffusion", f"diffusion cache={c} N={n}", {**opts, "cache": c}, f"N={n}", n)
                for c in ("none", "prefix", "dual")]
    explorer.decode("diffusion", models, "def f(x):", max_new_tokens=32, steps=8, block_length=32)  # warm-up
    frame = bench.run_requests(models, one, configs, bench.BenchSettings(warmup=0, progress=False, repeats=repeats,
                                                                    ignore_eos=True))
    frame.to_pickle(f"{OUT}/cache_{n}_{index}.pkl")
    print(sweeps.cache_table(frame).to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "cell":
        cell(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    else:
        frame = pd.concat([pd.read_pickle(f) for f in sorted(glob.glob(f"{OUT}/cache_*_*.pkl"))])
        print(sweeps.cache_table(frame).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
