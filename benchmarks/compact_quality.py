"""What storing the weights compactly (int8 rows / int4 groups, explorer/compact_weights.py) changes: greedy
text, acceptance and the diffusion lane's output.

    python benchmarks/compact_quality.py BEFORE_MODELS_DIR AFTER_MODELS_DIR [AFTER2 ...] [--tokens 48]

Each directory is an ``assets/models`` folder (tiny/ and smollm2-135m/); each side runs in its own process with
the loaders pointed at it, float32 compute, one thread, temperature 0. Printed per prompt, BEFORE against each
AFTER: whether the tiny target's greedy AR text is the same, the speculative acceptance with tiny's draft
(gamma 4), SmolLM2's draft and EAGLE head (gamma 4, 8 held-out chat prompts), and the tiny diffusion model's
text (default steps, temperature 0) with its per-position agreement. ``--smollm2-only`` skips the tiny family.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY_PROMPTS = ["def fibonacci(n):", "import os\n\n\ndef main():", "class Stack:\n    def __init__(self):",
                "for i in range(10):"]
SMOLLM2_PROMPTS = 8


def run_side(models_dir: Path, tokens: int, smollm2_only: bool = False) -> dict:
    import torch

    import explorer
    from explorer.families.smollm2 import load as smol_load
    from explorer.families.tiny import load as tiny_load
    from explorer.training.prompts import chat_prompts

    torch.set_num_threads(1)
    # the loaders read their folders from their family modules (explorer/families/*/load.py)
    tiny_load.TINY_DIR, smol_load.SMOLLM2_DIR = models_dir / "tiny", models_dir / "smollm2-135m"
    out: dict = {"tiny": [], "smollm2": []}
    tiny = explorer.load_models("tiny", device="cpu", precision="float32")
    for p in TINY_PROMPTS if not smollm2_only else []:
        ar = explorer.decode("autoregressive", tiny, p, max_new_tokens=tokens)
        sp = explorer.decode("speculative", tiny, p, max_new_tokens=tokens, gamma=4)
        df = explorer.decode("diffusion", tiny, p, max_new_tokens=tokens, temperature=0.0)
        out["tiny"].append({"prompt": p, "ar": ar.token_ids, "text": ar.text, "spec_same": sp.token_ids == ar.token_ids,
                            "acceptance": sp.stats["acceptance_rate"], "diff": df.token_ids, "diff_text": df.text})
    smol = explorer.load_models("smollm2-135m", device="cpu", precision="float32")
    prompts = [r["prompt"] for r in chat_prompts("heldout")][:SMOLLM2_PROMPTS]
    for p in prompts:
        ar = explorer.decode("autoregressive", smol, p, max_new_tokens=tokens)
        sp = explorer.decode("speculative", smol, p, max_new_tokens=tokens, gamma=4, drafter="model")
        ea = explorer.decode("speculative", smol, p, max_new_tokens=tokens, gamma=4, drafter="assistant")
        out["smollm2"].append({"prompt": p, "spec_same": sp.token_ids == ar.token_ids == ea.token_ids,
                               "acceptance": sp.stats["acceptance_rate"],
                               "tokens_per_target_pass": sp.stats["tokens_per_target_pass"],
                               "eagle_tokens_per_target_pass": ea.stats["tokens_per_target_pass"]})
    return out


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path, nargs="+")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--smollm2-only", action="store_true", help="skip the tiny family (its files unchanged)")
    ap.add_argument("--side", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.tokens, args.smollm2_only)))
        return
    extra = ["--smollm2-only"] if args.smollm2_only else []
    sides = [json.loads(subprocess.run([sys.executable, __file__, str(args.before), str(d), "--tokens",
                                        str(args.tokens), "--side", str(d), *extra], capture_output=True, text=True,
                                       check=True).stdout.splitlines()[-1]) for d in (args.before, *args.after)]
    for d, a in zip(args.after, sides[1:], strict=True):
        print(f"=== {args.before} -> {d}")
        report(sides[0], a)


def report(b: dict, a: dict) -> None:
    for x, y in zip(b["tiny"], a["tiny"], strict=True):
        same = x["ar"] == y["ar"]
        first = next((i for i, (s, t) in enumerate(zip(x["ar"], y["ar"], strict=False)) if s != t), None)
        print(f"tiny {x['prompt']!r:40} greedy AR same: {same}" + ("" if same else f" (first differs at token {first})")
              + f"; acceptance (draft, gamma 4) {x['acceptance']:.3f} -> {y['acceptance']:.3f};"
              f" spec == AR: {x['spec_same']}/{y['spec_same']}")
        if not same:
            print(f"    before: {x['text']!r}\n    after:  {y['text']!r}")
        agree = sum(s == t for s, t in zip(x["diff"], y["diff"], strict=False)) / max(len(x["diff"]), len(y["diff"]), 1)
        print(f"    diffusion: per-position agreement {agree:.3f}\n      before: {x['diff_text']!r}\n"
              f"      after:  {y['diff_text']!r}")
    for x, y in zip(b["smollm2"], a["smollm2"], strict=True):
        print(f"smollm2 {x['prompt'][:50]!r:54} draft acceptance (gamma 4) {x['acceptance']:.3f} -> "
              f"{y['acceptance']:.3f}; tokens/pass {x['tokens_per_target_pass']:.2f} -> "
              f"{y['tokens_per_target_pass']:.2f}; EAGLE head tokens/pass {x['eagle_tokens_per_target_pass']:.2f} -> "
              f"{y['eagle_tokens_per_target_pass']:.2f}; spec == AR: {x['spec_same']}/{y['spec_same']}")
    for fam in ("tiny", "smollm2")[1 if not b["tiny"] else 0:]:
        mb = sum(r["acceptance"] for r in b[fam]) / len(b[fam])
        ma = sum(r["acceptance"] for r in a[fam]) / len(a[fam])
        print(f"{fam}: mean acceptance {mb:.3f} -> {ma:.3f}")
    for key in ("tokens_per_target_pass", "eagle_tokens_per_target_pass"):
        mb = sum(r[key] for r in b["smollm2"]) / len(b["smollm2"])
        ma = sum(r[key] for r in a["smollm2"]) / len(a["smollm2"])
        print(f"smollm2: mean {key} {mb:.3f} -> {ma:.3f}")
    if not b["tiny"]:
        return
    agree = [sum(s == t for s, t in zip(x["diff"], y["diff"], strict=False)) / max(len(x["diff"]), len(y["diff"]), 1)
             for x, y in zip(b["tiny"], a["tiny"], strict=True)]
    print(f"tiny diffusion: mean per-position agreement {sum(agree) / len(agree):.3f}")


if __name__ == "__main__":
    main()
