"""Token trees against chains on this CPU: tokens per target pass, what a verify pass costs, the speedup, the KV
memory a tree holds.

    python benchmarks/tree_vs_chain.py [--preset tiny] [--prompts 6] [--tokens 64] [--drafter model]
        [--configs "chain:4,tree:dynamic:4,chain:8,tree:dynamic:8,tree:3,2,1,chain:3,tree:dynamic:16,chain:16"]

One torch thread, greedy unless --temperature (speedups are per token). Each prompt is decoded by every config in
turn (interleaved, so a load change hits all configs alike), autoregressive first. Pairs of equal verified tokens
per pass: a chain of gamma = n drafts and a dynamic tree of n nodes both feed n + 1 positions to the verify pass.
Then the verify pass alone: one target pass over M tokens after a 64-token prefix (M = 1 is an autoregressive
step), median of --reps, to show how its cost grows with the positions verified on a CPU. The machine may be
shared: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import explorer  # noqa: E402
from explorer.decoding.events import Verification  # noqa: E402
from explorer.decoding.tree import verify_inputs  # noqa: E402

DEFAULT_CONFIGS = "chain:3,tree:3,2,1,chain:4,tree:dynamic:4,chain:8,tree:dynamic:8,chain:16,tree:dynamic:16"


def parse_configs(text: str) -> list[tuple[str, dict]]:
    """'chain:4,tree:3,2,1,...' -> [(label, decode options)]: a tree spec runs until the next 'chain:'/'tree:'."""
    out, parts = [], text.split(",")
    i = 0
    while i < len(parts):
        kind, _, value = parts[i].partition(":")
        i += 1
        if kind == "chain":
            out.append((f"chain γ={value}", {"gamma": int(value)}))
            continue
        spec = [value]
        while i < len(parts) and not parts[i].startswith(("chain:", "tree:")):
            spec.append(parts[i])
            i += 1
        out.append((f"tree {','.join(spec)}", {"tree": ",".join(spec)}))
    return out


def prompts_for(preset: str, count: int) -> list[str]:
    if preset == "tiny":
        rows = [json.loads(line)["prompt"] for line in (ROOT / "assets/prompts/code.jsonl").read_text().splitlines()]
    else:
        rows = [line for line in (ROOT / "assets/prompts/chat.txt").read_text().splitlines() if line.strip()]
    return rows[:count]


def kv_bytes_per_position(model) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * next(model.parameters()).element_size()


def verify_costs(model, sizes: list[int], reps: int) -> dict[int, float]:
    """Median seconds of one target pass over M tree tokens (a chain-shaped tree) after a 64-token prefix."""
    from transformers import DynamicCache

    from explorer.decoding.tree import select_cache

    prefix = torch.randint(5, 200, (1, 63))  # the 64th token is the root, fed with the tree
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=prefix, past_key_values=cache, use_cache=True)
    inputs = {}
    for m in sizes:
        parents = list(range(-1, m - 2)) if m > 1 else []
        inputs[m] = (torch.randint(5, 200, (1, m)), *verify_inputs(parents, 63, 1, torch.float32, model.device))
    times: dict[int, list[float]] = {m: [] for m in sizes}
    for _ in range(reps):  # the sizes interleaved within each repetition, so a load change hits them alike
        for m, (ids, mask, pos) in inputs.items():
            start = time.perf_counter()
            with torch.inference_mode():
                model(input_ids=ids, past_key_values=cache, use_cache=True, attention_mask=mask, position_ids=pos)
            times[m].append(time.perf_counter() - start)
            select_cache(cache, list(range(63)))
    return {m: statistics.median(t) for m, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", default="model")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs equal autoregressive)")
    ap.add_argument("--verify-only", action="store_true", help="only the verify-pass cost table")
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = explorer.load_models(args.preset, device="cpu")
    if not args.verify_only:
        compare_decodes(models, args)
    print_verify_costs(models, args.reps)


def compare_decodes(models, args: argparse.Namespace) -> None:
    configs = parse_configs(args.configs)
    rows: dict[str, dict[str, list[float]]] = {label: {} for label, _ in [("autoregressive", {})] + configs}
    for prompt in prompts_for(args.preset, args.prompts):
        explorer.decode("autoregressive", models, prompt, max_new_tokens=4)  # warm the caches of this shape
        for label, options in [("autoregressive", None)] + configs:
            method = "autoregressive" if options is None else "speculative"
            extra = {} if options is None else {"drafter": args.drafter, **options}
            trace = explorer.decode(method, models, prompt, max_new_tokens=args.tokens, temperature=args.temperature,
                                    **extra)
            s = trace.stats
            verify = [e.forward_s for e in trace.events if isinstance(e, Verification)][1:]  # the prefill apart
            r = rows[label]
            for key, value in [("wall_s", s["wall_s"]), ("tokens", s["new_tokens"]),
                               ("passes", s["target_forward_passes"]),
                               ("verify_s", statistics.mean(verify) if verify else None),
                               ("draft_s", s["draft_forward_s"]), ("proposed", s["proposed"])]:
                if value is not None:
                    r.setdefault(key, []).append(value)
    ar_per_token = sum(rows["autoregressive"]["wall_s"]) / sum(rows["autoregressive"]["tokens"])
    ar_step = statistics.mean(rows["autoregressive"]["wall_s"]) / statistics.mean(rows["autoregressive"]["tokens"])
    per_pos = kv_bytes_per_position(models.target)
    print(f"preset {args.preset}, drafter {args.drafter}, {args.prompts} prompts x {args.tokens} tokens, "
          f"T = {args.temperature}, 1 torch thread; target KV {per_pos / 1024:.1f} KiB per position")
    print("| config | tokens/target pass | verified positions/pass | verify pass s (mean) | draft s/step | "
          "speedup vs AR | tree KV held in the verify pass |")
    print("|---|---|---|---|---|---|---|")
    chain_speed = {}
    for label, _ in configs:
        r = rows[label]
        passes = sum(r["passes"])
        speed = ar_per_token / (sum(r["wall_s"]) / sum(r["tokens"]))  # wall seconds per token, AR over this
        fed = sum(r["proposed"]) / passes + 1
        chain_speed[label] = speed
        print(f"| {label} | {sum(r['tokens']) / passes:.2f} | {fed:.1f} | {statistics.mean(r['verify_s']):.4f} | "
              f"{sum(r['draft_s']) / passes:.4f} | {speed:.2f}x | {(fed - 1) * per_pos / 1024:.0f} KiB |")
    print(f"\nautoregressive: {ar_step * 1000:.1f} ms per token (wall)")
    pairs = [(c, t) for c in chain_speed for t in chain_speed
             if c.startswith("chain γ=") and t == f"tree dynamic:{c.removeprefix('chain γ=')}"]
    for chain, tree in pairs:
        print(f"{tree} vs {chain} (equal verified positions): {chain_speed[tree] / chain_speed[chain]:.2f}x")


def print_verify_costs(models, reps: int) -> None:
    sizes = [1, 2, 4, 5, 8, 9, 16, 17, 32]
    costs = verify_costs(models.target, sizes, reps)
    print(f"\nverify pass over M positions after a 64-token prefix (median of {reps}, sizes interleaved):")
    print("| M | seconds | vs M = 1 | per position vs M = 1 |")
    print("|---|---|---|---|")
    for m in sizes:
        print(f"| {m} | {costs[m]:.4f} | {costs[m] / costs[1]:.2f}x | {costs[m] / costs[1] / m:.2f} |")


if __name__ == "__main__":
    main()
