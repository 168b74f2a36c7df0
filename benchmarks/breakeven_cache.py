"""Break-even N with the diffusion KV cache (issue 10): `explorer bench --sweep diffusion` on one prompt,
N = 32..256, K = N/4 only (the default cache, and the no-cache series). Writes runs/issue10/breakeven.*"""
import os
import sys

import torch

import explorer
from explorer.measure import bench, bench_cli, sweeps
from explorer.measure.report import write_report
from explorer.measure.workload import load_prompt_sets

torch.set_num_threads(1)
os.makedirs("runs/issue10", exist_ok=True)
models = explorer.load_models("tiny", device="cpu")
sets = load_prompt_sets("code", 1)
section, frame = sweeps.diffusion_section(models, sets, bench.BenchSettings(quality=False), lengths=(32, 64, 128, 256),
                                         divisors=(4,))
bench_cli.print_section(section)
frame.drop(columns=["itl_s", "token_ids"]).to_csv("runs/issue10/breakeven.csv", index=False)
write_report("runs/issue10/breakeven.html", {"machine": bench_cli.cpu_name(), "command": " ".join(sys.argv)}, [section])
